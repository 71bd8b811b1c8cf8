"""metal-kernels/gated_delta.cu's body transliterated to numpy (lanes as an axis, its shuffles as
permutations, products and sums rounded to float32 as the kernel rounds them), against mlx-lm's
ops (`gated_delta_ops`) on this machine's CPU: the lanes' shares of a state row and the masks
past Dk are checked here without a GPU (the CPU's sums run in another order than MLX's CUDA
reduction, so the two agree within a float32 rounding, not bit for bit).

usage: vendor/pyref/bin/python scripts/gated-delta-emulate.py
"""
import numpy as np, mlx.core as mx
from mlx_lm.models.gated_delta import gated_delta_ops
f32=np.float32
def kernel(q,k,v,g,beta,state):  # q,k [B,T,Hk,Dk], v [B,T,Hv,Dv], g,beta [B,T,Hv], state [B,Hv,Dv,Dk]
    B,T,Hk,Dk=q.shape; Hv,Dv=v.shape[2:]
    NPT=4*((Dk+127)//128)
    y=np.zeros((B,T,Hv,Dv),f32); st=state.copy()
    lanes=np.arange(32)
    e=np.array([[ (i//4)*128+l*4+i%4 for i in range(NPT)] for l in lanes])  # [32,NPT]
    valid=e<Dk; ec=np.where(valid,e,0)
    def wsum(x):  # x [32] per-lane partials: xor 16..1
        x=x.copy()
        for o in (16,8,4,2,1):
            x=(x+x[lanes^o]).astype(f32)
        return x[0]
    for b in range(B):
        for hv in range(Hv):
            hk=hv//(Hv//Hk)
            for dv in range(Dv):
                s=np.where(valid, st[b,hv,dv][ec], f32(0)).astype(f32)
                for t in range(T):
                    s=(s*g[b,t,hv]).astype(f32)
                    kk=k[b,t,hk][ec]; qq=q[b,t,hk][ec]
                    m=np.zeros(32,f32)
                    for i in range(NPT):
                        m=(m+np.where(valid[:,i],(s[:,i]*kk[:,i]).astype(f32),f32(0))).astype(f32)
                    m=wsum(m)
                    delta=f32(f32(v[b,t,hv,dv]-m)*beta[b,t,hv])
                    out=np.zeros(32,f32)
                    for i in range(NPT):
                        s[:,i]=np.where(valid[:,i],(s[:,i].astype(np.float64)+kk[:,i].astype(np.float64)*np.float64(delta)).astype(f32),s[:,i])
                        out=(out+np.where(valid[:,i],(s[:,i]*qq[:,i]).astype(f32),f32(0))).astype(f32)
                    y[b,t,hv,dv]=wsum(out)
                st[b,hv,dv][ec[valid]]=s[valid]
    return y,st
rng=np.random.default_rng(0)
for (B,T,Hk,Hv,Dk,Dv) in [(2,3,1,2,32,8),(1,2,2,4,64,4),(1,2,1,1,128,4),(1,2,1,2,256,3),(1,1,1,1,160,2)]:
    q=rng.standard_normal((B,T,Hk,Dk)).astype(f32)*0.1; k=rng.standard_normal((B,T,Hk,Dk)).astype(f32)*0.1
    v=rng.standard_normal((B,T,Hv,Dv)).astype(f32); g=rng.uniform(0.5,1,(B,T,Hv)).astype(f32); beta=rng.uniform(0,1,(B,T,Hv)).astype(f32)
    state=rng.standard_normal((B,Hv,Dv,Dk)).astype(f32)
    y,st=kernel(q,k,v,g,beta,state)
    yr,sr=gated_delta_ops(mx.array(q),mx.array(k),mx.array(v),mx.array(g),mx.array(beta),mx.array(state))
    dy, ds = np.abs(y - np.array(yr)).max(), np.abs(st - np.array(sr)).max()
    print(f"B {B} T {T} Hk {Hk} Hv {Hv} Dk {Dk} Dv {Dv}: y within {dy:.2e}, state within {ds:.2e}")
    assert dy < 1e-5 and ds < 1e-5, "the emulated kernel does not compute the rule"
