"""Checks byte-index-kernel.diff's index arithmetic on the CPU: the new voff
(a byte permute out of words built once per position pair) against the
kernel's current vidx, emulated bit for bit in Python on random value codes,
for 2-, 3- and 4-bit codes at head dims 64, 128 and 256 (voff is the pair
index times 4: its byte offset in a table of 4-byte entries). Not a kernel
test: the kernel itself still needs its tests on a GPU.

usage: python3 byte-index-emulate.py
"""
import random
M=0xFFFFFFFF
def byte_perm(x,y,s):
    b=[(x>>(8*i))&255 for i in range(4)]+[(y>>(8*i))&255 for i in range(4)]
    return sum(b[(s>>(4*i))&7]<<(8*i) for i in range(4))
def spread(x):
    x=byte_perm(x,0,0x4140)
    x=(x|(x<<4))&0x0F0F0F0F; x=(x|(x<<2))&0x33333333; return (x|(x<<1))&0x55555555
for VBITS in (2,3,4):
  for D in (64,128,256):
    DPL=D//8; VB2=4 if VBITS==4 else 2; NB=DPL*VB2//8; VW=(NB+3)//4
    for trial in range(300):
      w0s=[random.getrandbits(32 if NB>=4 else 16) for _ in range(VW)]
      w1s=[random.getrandbits(32 if NB>=4 else 16) for _ in range(VW)]
      hb=DPL
      h0=random.getrandbits(hb) if VBITS==3 else 0; h1=random.getrandbits(hb) if VBITS==3 else 0
      # old
      e=[];o=[]
      for i in range(VW):
        w0,w1=w0s[i],w1s[i]
        if VB2==4: e.append((w0&0x0F0F0F0F)|((w1<<4)&0xF0F0F0F0)); o.append(((w0>>4)&0x0F0F0F0F)|(w1&0xF0F0F0F0))
        else: e.append((w0&0x33333333)|((w1<<2)&0xCCCCCCCC)&M); o.append(((w0>>2)&0x33333333)|(w1&0xCCCCCCCC))
      def vidx(j):
        DPW=32//VB2; w=(e if j%2==0 else o)[j//DPW]
        f=(w>>(2*VB2*((j%DPW)//2)))&((1<<(2*VB2))-1)
        if VBITS==3: f|=((h0>>j)&1)<<4|((h1>>j)&1)<<5
        return f
      # new
      x=[]
      for i in range(VW):
        w0,w1=w0s[i],w1s[i]
        if VB2==4: x.append([(w0&0x0F0F0F0F)|((w1<<4)&0xF0F0F0F0)&M, ((w0>>4)&0x0F0F0F0F)|(w1&0xF0F0F0F0)])
        else:
          ee=((w0&0x33333333)|((w1<<2)&0xCCCCCCCC))&M; oo=(((w0>>2)&0x33333333)|(w1&0xCCCCCCCC))&M
          hh=(spread((h0>>(16*i))&M)|(spread((h1>>(16*i))&M)<<1))&M if VBITS==3 else 0
          x.append([((ee<<2)&0x3C3C3C3C)|((hh<<6)&0xC0C0C0C0), ((oo<<2)&0x3C3C3C3C)|((hh<<4)&0xC0C0C0C0),
                    ((ee>>2)&0x3C3C3C3C)|((hh<<2)&0xC0C0C0C0), ((oo>>2)&0x3C3C3C3C)|(hh&0xC0C0C0C0)])
      def voff(j):
        if VB2==4: return (byte_perm(x[j//8][j%2],0,0x4440|((j%8)//2))<<2)&M
        return byte_perm(x[j//16][j%4],0,0x4440|((j%16)//4))
      for j in range(DPL):
        assert voff(j)==4*vidx(j),(VBITS,D,j,voff(j),vidx(j))
print("voff == 4 * vidx for VBITS 2-4, D 64/128/256")
