"""moe_router.cu's body transliterated statement by statement to numpy (a warp's 32 lanes
as vectors, shuffles as index permutations), against mlx-lm's routing ops on the CPU: a
check of the kernel's algorithm and roundings without a GPU (NVRTC checks that it compiles:
scripts/check-cuda-kernels.py). Keep it in step with the kernel when either changes.

usage: vendor/pyref/bin/python scripts/moe-router-emulate.py
"""
import numpy as np, mlx.core as mx, itertools, sys


def rnd(x, T):
    """x rounded to the MLX dtype T, as float32."""
    return np.array(mx.array(np.asarray(x, np.float32)).astype(T).astype(mx.float32))


def kernel(row_logits, E, K, SF, NORM, T, HIGH):
    """One warp's row: (experts, scores) as moe_router.cu computes them; v[i] is register i of every lane."""
    PER=(E+31)//32; lane=np.arange(32); NEG=-np.inf
    v=np.full((PER,32),NEG,np.float32)
    for i in range(PER):
        e=lane+32*i; ok=e<E; v[i,ok]=row_logits[e[ok]]
    if SF:
        m=np.max(v,axis=0)
        for o in (16,8,4,2,1): m=np.maximum(m,m[lane^o])
        s=np.zeros(32,np.float32)
        for i in range(PER):
            ok=lane+32*i<E; v[i]=np.where(ok,np.exp(v[i]-m),0).astype(np.float32); s=s+v[i]
        for o in (16,8,4,2,1): s=s+s[lane^o]
        for i in range(PER):
            ok=lane+32*i<E; v[i]=np.where(ok,rnd(v[i]/s,T),NEG)
    # The K warp-wide argmax rounds; every lane must end each with the same choice.
    v=np.where(np.isnan(v),NEG,v)
    taken=np.zeros(32,np.uint32); val=[];idx=[]
    NONE=0xffffffff
    for j in range(K):
        best=np.full(32,NEG,np.float32); bi=np.full(32,NONE,np.uint64)
        for i in range(PER):
            e=(lane+32*i).astype(np.uint64)
            c=(e<E)&(((taken>>i)&1)==0)&((bi==NONE)|(v[i]>best)|(HIGH&(v[i]==best)))
            best=np.where(c,v[i],best); bi=np.where(c,e,bi)
        for o in (16,8,4,2,1):
            ob=best[lane^o]; oi=bi[lane^o]
            c=(oi!=NONE)&((bi==NONE)|(ob>best)|((ob==best)&((oi>bi) if HIGH else (oi<bi))))
            best=np.where(c,ob,best); bi=np.where(c,oi,bi)
        assert len(set(bi.tolist()))==1 and len(set(best.tolist()))<=1, "lanes disagree"
        own=(bi%32)==lane
        taken=np.where(own,taken|(np.uint32(1)<<(bi//32).astype(np.uint32)),taken)
        val.append(best[0]); idx.append(int(bi[0]))
    val=np.array(val,np.float32)
    if SF: score=val.copy()
    else:
        score=np.exp(val-val[0]).astype(np.float32); s=np.float32(score.sum()); score=rnd(score/s,T)
    if NORM:
        s=rnd(np.float32(score.sum()),T); score=score/s
    return np.array(idx), rnd(score,T)


def ops(lg, K, router, NORM):
    """mlx-lm's routing: last/first = softmax then argpartition's last/first K; tks/tkl = the K logits then softmax."""
    E=lg.shape[-1]
    if router in ("last","first"):
        g=mx.softmax(lg,axis=-1,precise=True)
        inds=mx.argpartition(g,kth=-K,axis=-1)[...,-K:] if router=="last" else mx.argpartition(-g,kth=K-1,axis=-1)[...,:K]
        sc=mx.take_along_axis(g,inds,axis=-1)
    else:
        inds=mx.argpartition(-lg,kth=K-1,axis=-1)[...,:K] if router=="tks" else mx.argpartition(lg,kth=-K,axis=-1)[...,-K:]
        sc=mx.softmax(mx.take_along_axis(lg,inds,axis=-1),axis=-1,precise=True)
    if NORM: sc=sc/sc.sum(axis=-1,keepdims=True)
    return np.array(inds), np.array(sc.astype(mx.float32))


# Every family's expert count and top-k, three dtypes, each router order, normalized or not.
bad=0; n=0; exact=[0]
for (E,K),T,router,NORM in itertools.product([(8,2),(60,4),(128,8),(512,10)],[mx.bfloat16,mx.float16,mx.float32],["last","first","tks","tkl"],[0,1]):
    SF=router in ("last","first")
    lg=(mx.random.normal((40,E),key=mx.random.key(E+K))*3).astype(T)
    lgf=np.array(lg.astype(mx.float32))
    wi,ws=ops(lg,K,router,NORM)
    for r in range(40):
        gi,gs=kernel(lgf[r],E,K,SF,NORM,T,router in ('last','tkl'))
        n+=1
        same=np.array_equal(np.sort(gs),np.sort(ws[r])); exact[0]+=same
        if sorted(gi)!=sorted(wi[r].tolist()) or np.max(np.abs(np.sort(gs)-np.sort(ws[r])))>(2/128 if T!=mx.float32 else 2e-5):
            bad+=1; print("differs",E,K,T,router,NORM,r,sorted(gi),sorted(wi[r].tolist()),np.sort(gs),np.sort(ws[r]))
print(n,"rows,",bad,"differ,",exact[0],"with bit-equal scores")
sys.exit(1 if bad else 0)
