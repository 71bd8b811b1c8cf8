//! MLX's distributed layer over the ring backend on localhost: this test
//! starts two copies of its own binary as ranks 0 and 1 (MLX_RANK and
//! MLX_HOSTFILE, as `mlx.launch` sets them), each running `ring_rank`.

use std::net::TcpListener;
use std::process::Command;

use mlx_rs_safe::distributed::{self, Group};
use mlx_rs_safe::{Array, Dtype};

/// A free localhost port (the listener is closed before the ranks bind it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_process_started_alone_is_a_group_of_one() {
    if std::env::var_os("MLX_RANK").is_some() {
        return;
    }
    let g = Group::init(None, false).unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
    // A group of one: the collectives are identities.
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    assert_eq!(g.take_error(), None, "no collective yet");
    assert_eq!(g.all_sum(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert_eq!(g.take_error(), None, "the sum left no error on its stream");
    assert!(distributed::is_available(Some("ring")).unwrap());
}

#[test]
fn two_ranks_over_the_ring_sum_gather_send_and_receive() {
    if std::env::var_os("MLX_RANK").is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hosts.json");
    std::fs::write(&hostfile, format!("[[\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"]]", free_port(), free_port())).unwrap();
    let exe = std::env::current_exe().unwrap();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args(["--exact", "ring_rank", "--nocapture", "--test-threads", "1"])
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                // Its own test summary would garble the parent's.
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, mut child) in ranks.into_iter().enumerate() {
        let status = child.wait().unwrap();
        assert!(status.success(), "rank {rank} failed: {status}");
    }
}

/// One rank of the test above (returns at once when run on its own).
#[test]
fn ring_rank() {
    let Some(rank) = std::env::var("MLX_RANK").ok().and_then(|r| r.parse::<usize>().ok()) else { return };
    let g = Group::init(Some("ring"), true).unwrap();
    assert_eq!((g.rank(), g.size()), (rank, 2));
    let mine = Array::from_slice(&[rank as f32 + 1.0, 10.0], &[1, 2]).unwrap();
    assert_eq!(g.all_sum(&mine).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 20.0]);
    let all = g.all_gather(&mine).unwrap();
    assert_eq!(all.shape(), vec![2, 2]);
    assert_eq!(all.to_vec::<f32>().unwrap(), vec![1.0, 10.0, 2.0, 10.0]);
    // Bytes summed with a rank's zeros arrive unchanged: a broadcast.
    let bytes: Vec<u8> = if rank == 0 { b"lockstep".to_vec() } else { vec![0; 8] };
    let got = g.all_sum(&Array::from_slice(&bytes, &[8]).unwrap()).unwrap();
    assert_eq!(got.to_vec::<u8>().unwrap(), b"lockstep".to_vec());
    if rank == 0 {
        let sent = g.send(&mine, 1).unwrap();
        mlx_rs_safe::eval(&[&sent]).unwrap();
    } else {
        let got = g.recv_like(&mine, 0).unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap(), vec![1.0, 10.0]);
        assert_eq!(got.dtype(), Dtype::Float32);
    }
}
