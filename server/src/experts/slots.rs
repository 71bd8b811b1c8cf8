//! `SlotTable`: which expert each slot of one layer's pool holds, and what a
//! step must read and evict. Policy: recency first (the slots after a step hold
//! the experts its last tokens used, as a per-token LRU would), frequency as
//! the tie-break among equally recent slots; free slots are filled first.
//! Pure bookkeeping: the pool arrays themselves live in the MoE layer.

/// What one step of one layer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Distinct experts the step uses, most recently used (latest token) first.
    pub used: Vec<u32>,
    /// Of `used`, those not in the pool: each is read from disk once.
    pub misses: Vec<u32>,
    /// (index into `misses`, slot) for the misses that go into the pool.
    pub installs: Vec<(usize, u32)>,
    /// Every used expert is in the pool after the installs: the step gathers
    /// from the pool. Otherwise (more distinct experts than slots, e.g. a
    /// prefill chunk) it gathers from a one-step staging set.
    pub fits: bool,
}

impl Plan {
    pub fn hits(&self) -> usize {
        self.used.len() - self.misses.len()
    }
}

#[derive(Debug, Clone)]
pub struct SlotTable {
    slot_of: Vec<Option<u32>>,
    holder: Vec<Option<u32>>,
    last_used: Vec<u64>,
    uses: Vec<u64>,
    clock: u64,
}

impl SlotTable {
    pub fn new(experts: usize, slots: usize) -> SlotTable {
        SlotTable { slot_of: vec![None; experts], holder: vec![None; slots], last_used: vec![0; slots], uses: vec![0; slots], clock: 0 }
    }

    pub fn slots(&self) -> usize {
        self.holder.len()
    }

    pub fn slot(&self, expert: u32) -> Option<u32> {
        self.slot_of.get(expert as usize).copied().flatten()
    }

    pub fn resident(&self) -> usize {
        self.holder.iter().filter(|h| h.is_some()).count()
    }

    /// Every expert of the layer is in the pool: nothing can miss any more.
    pub fn is_complete(&self) -> bool {
        self.resident() == self.slot_of.len()
    }

    /// The slot of every expert, slot 0 for those not in the pool: what a
    /// step routes through on the device without asking the host (exact once
    /// the table is complete; a speculative step checks its choice after).
    pub fn device_map(&self) -> Vec<u32> {
        self.slot_of.iter().map(|s| s.unwrap_or(0)).collect()
    }

    /// The plan for a step whose tokens chose `ids` (row-major, token order).
    /// Every id must be below the expert count.
    pub fn plan(&self, ids: &[u32]) -> Plan {
        let mut seen = vec![false; self.slot_of.len()];
        let mut used = Vec::new();
        for &e in ids.iter().rev() {
            if !std::mem::replace(&mut seen[e as usize], true) {
                used.push(e);
            }
        }
        let keep = &used[..used.len().min(self.slots())];
        let mut kept = vec![false; self.slot_of.len()];
        for &e in keep {
            kept[e as usize] = true;
        }
        let misses: Vec<u32> = used.iter().copied().filter(|&e| self.slot(e).is_none()).collect();
        // Victims: slots whose expert the step does not keep; free ones first,
        // then least recently used, then least often used.
        let mut victims: Vec<u32> = (0..self.slots() as u32).filter(|&s| self.holder[s as usize].is_none_or(|e| !kept[e as usize])).collect();
        victims.sort_by_key(|&s| (self.holder[s as usize].is_some(), self.last_used[s as usize], self.uses[s as usize]));
        let installs: Vec<(usize, u32)> =
            misses.iter().enumerate().filter(|(_, &e)| kept[e as usize]).map(|(i, _)| i).zip(victims).collect();
        Plan { fits: used.len() <= self.slots(), used, misses, installs }
    }

    /// Records that `plan` ran: installs placed, every used resident expert
    /// touched. Returns how many installs filled a free slot.
    pub fn commit(&mut self, plan: &Plan) -> usize {
        self.clock += 1;
        let mut filled = 0;
        for &(i, slot) in &plan.installs {
            let e = plan.misses[i];
            match self.holder[slot as usize].replace(e) {
                Some(old) => self.slot_of[old as usize] = None,
                None => filled += 1,
            }
            self.slot_of[e as usize] = Some(slot);
            self.uses[slot as usize] = 0;
        }
        for &e in &plan.used {
            if let Some(s) = self.slot(e) {
                self.last_used[s as usize] = self.clock;
                self.uses[s as usize] += 1;
            }
        }
        filled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_fills_free_slots_and_counts_every_expert_as_a_miss() {
        let t = SlotTable::new(8, 4);
        let p = t.plan(&[1, 2, 2, 3]);
        assert_eq!(p.used, vec![3, 2, 1]);
        assert_eq!(p.misses, vec![3, 2, 1]);
        assert_eq!(p.hits(), 0);
        assert!(p.fits);
        assert_eq!(p.installs.len(), 3);
    }

    #[test]
    fn a_repeated_step_hits_every_expert() {
        let mut t = SlotTable::new(8, 4);
        let p = t.plan(&[1, 2]);
        t.commit(&p);
        let p = t.plan(&[2, 1]);
        assert_eq!(p.misses, Vec::<u32>::new());
        assert_eq!(p.hits(), 2);
    }

    #[test]
    fn eviction_takes_the_least_recent_then_least_frequent_slot() {
        let mut t = SlotTable::new(8, 2);
        for ids in [[0u32, 1], [0, 1], [0, 0]] {
            let p = t.plan(&ids);
            t.commit(&p);
        }
        // 0 was used last; 1 is older: 1's slot goes.
        let p = t.plan(&[5]);
        t.commit(&p);
        assert_eq!(t.slot(1), None);
        assert!(t.slot(0).is_some() && t.slot(5).is_some());
        // Equal recency (both used at the last step): the less used one goes.
        let mut t = SlotTable::new(8, 2);
        for ids in [[0u32, 1], [0, 2]] {
            let p = t.plan(&ids);
            t.commit(&p);
        }
        let p = t.plan(&[0, 2]);
        t.commit(&p);
        let p = t.plan(&[7]);
        t.commit(&p);
        assert_eq!(t.slot(2), None, "2 was used twice, 0 three times");
        assert!(t.slot(0).is_some());
    }

    #[test]
    fn a_step_wider_than_the_pool_stages_and_keeps_its_latest_experts() {
        let mut t = SlotTable::new(16, 3);
        // Tokens in order: the last one used 9 and 4, the one before 7.
        let p = t.plan(&[1, 2, 3, 5, 7, 9, 4]);
        assert!(!p.fits);
        assert_eq!(p.misses.len(), 7);
        assert_eq!(p.installs.len(), 3);
        t.commit(&p);
        for e in [4, 9, 7] {
            assert!(t.slot(e).is_some(), "expert {e} of the latest tokens stays");
        }
        assert_eq!(t.resident(), 3);
    }

    #[test]
    fn a_full_table_is_complete_and_maps_every_expert_to_its_own_slot() {
        let mut t = SlotTable::new(3, 3);
        assert!(!t.is_complete());
        let p = t.plan(&[2, 0, 1]);
        t.commit(&p);
        assert!(t.is_complete());
        let mut sorted = t.device_map();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2]);
    }

    #[test]
    fn the_device_map_sends_experts_not_in_the_pool_to_slot_0() {
        let mut t = SlotTable::new(4, 2);
        let p = t.plan(&[3, 1]);
        t.commit(&p);
        let map = t.device_map();
        assert_eq!((map[0], map[2]), (0, 0));
        assert_eq!([map[1], map[3]].iter().copied().collect::<std::collections::BTreeSet<_>>(), [0, 1].into());
    }
}
