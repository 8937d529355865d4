# mmv_emu: src/kernels/cuda/mmv.cu's kernel emulated lane by lane in Python (no GPU, no
# numpy): each lane's code words, scales and x pieces as the kernel loads them, the pairs it
# builds (mmv_nib_pair, codes8_bf16, mmv_split), mma.m16n8k16 .row.col bf16 (A and B rebuilt
# from the lanes' registers by the PTX ISA's fragment tables, multiplied in double, C handed
# back by the same tables), the quad sums of x and their shuffles, the group fold, the
# warps' reduction and the final writes, against y = x (s q + b)ᵀ. It checks the kernel's
# index arithmetic, not PTX semantics or timing: keep it in step with mmv.cu.
#   python3 dev/kernels/mmv_emu.py      (a few seconds; each shape prints its rel err)
import random, struct

def f2bf(v):  # bf16 bits, round to nearest even
    u = struct.unpack('<I', struct.pack('<f', v))[0]
    return ((u + ((u >> 16) & 1) + 0x7fff) >> 16) & 0xffff

def bf2f(h):
    return struct.unpack('<f', struct.pack('<I', (h & 0xffff) << 16))[0]

def pair(lo, hi):
    return (lo & 0xffff) | (hi & 0xffff) << 16

def halves(r):
    return bf2f(r & 0xffff), bf2f(r >> 16)

def nib_pair(w, j):  # elements j and j + 4 of a 4-bit word, exactly (128 + q - 128)
    r = ((w >> (4 * j)) & 0x000f000f) | 0x43004300
    a, b = halves(r)
    return pair(f2bf(a - 128.0), f2bf(b - 128.0))

def codes8(w, k):  # bytes k, k + 1
    return pair(f2bf(float((w >> (8 * k)) & 0xff)), f2bf(float((w >> (8 * k + 8)) & 0xff)))

def split(a, b):
    ha, hb = f2bf(a), f2bf(b)
    return pair(ha, hb), pair(f2bf(a - bf2f(ha)), f2bf(b - bf2f(hb)))

def mma(acc, a, b0, b1):
    """acc[lane] (4 floats) += A B for a warp; a[lane] = 4 regs, b0/b1[lane] = regs."""
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for l in range(32):
        g, c = l // 4, l % 4
        for (reg, row, k) in ((0, g, 2 * c), (1, g + 8, 2 * c), (2, g, 2 * c + 8), (3, g + 8, 2 * c + 8)):
            A[row][k], A[row][k + 1] = halves(a[l][reg])
        B[2 * c][g], B[2 * c + 1][g] = halves(b0[l])
        B[2 * c + 8][g], B[2 * c + 9][g] = halves(b1[l])
    for l in range(32):
        g, c = l // 4, l % 4
        for i, (row, n) in enumerate(((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1))):
            acc[l][i] += sum(A[row][k] * B[k][n] for k in range(16))

def mmv_u(bits, group):
    return 4 if group * bits // 32 <= 8 else 2 if group * bits // 32 == 16 else 1

def run(bits, group, rt, ks, out, inn, n_tok, seed):
    rnd = random.Random(seed)
    per_word = 32 // bits
    codes = [[rnd.randrange(1 << bits) for _ in range(inn)] for _ in range(out)]
    words = [[sum(codes[r][w * per_word + e] << (bits * e) for e in range(per_word))
              for w in range(inn // per_word)] for r in range(out)]
    ng = inn // group
    sc = [[bf2f(f2bf(rnd.uniform(0.01, 0.05))) for _ in range(ng)] for _ in range(out)]
    bi = [[bf2f(f2bf(rnd.uniform(-0.2, 0.2))) for _ in range(ng)] for _ in range(out)]
    x = [[rnd.uniform(-1, 1) for _ in range(inn)] for _ in range(n_tok)]
    ref = [[sum((sc[r][k // group] * codes[r][k] + bi[r][k // group]) * x[t][k] for k in range(inn))
            for r in range(out)] for t in range(n_tok)]
    CPT = group // 4
    BPT = CPT * bits // 8
    WPT = BPT // 4
    U = mmv_u(bits, group)
    y = [[None] * out for _ in range(n_tok)]
    nb = (out + 16 * rt - 1) // (16 * rt)
    for blk in range(nb):
        r0 = blk * 16 * rt
        red = []
        for wid in range(ks):
            yl = [[[0.0] * 4 for _ in range(rt)] for _ in range(32)]
            g0 = wid * U
            while g0 < ng:
                for u in range(U):
                    gi = g0 + u
                    if gi >= ng:
                        break
                    # every lane's loads
                    q = {}
                    xv = {}
                    xsum = [0.0] * 32
                    for l in range(32):
                        g, c = l // 4, l % 4
                        for t in range(rt):
                            for h in range(2):
                                rr = min(r0 + 16 * t + 8 * h + g, out - 1)
                                w0 = (gi * group * bits // 8 + c * BPT) // 4
                                q[l, t, h] = words[rr][w0:w0 + WPT]
                        tok = g if g < n_tok else None
                        base = gi * group + c * CPT
                        xv[l] = [x[tok][base + i] if tok is not None else 0.0 for i in range(CPT)]
                        xsum[l] = sum(xv[l])
                    # quad sums, then tokens 2c and 2c + 1
                    quad = [xsum[l] + xsum[l ^ 1] for l in range(32)]
                    quad = [quad[l] + quad[l ^ 2] for l in range(32)]
                    xs0 = [quad[8 * (l % 4)] for l in range(32)]
                    xs1 = [quad[8 * (l % 4) + 4] for l in range(32)]
                    acc = [[[0.0] * 4 for _ in range(rt)] for _ in range(32)]
                    for j in range(WPT):
                        steps = 2 if bits == 4 else 1
                        for st in range(steps):
                            bh0, bl0, bh1, bl1 = [None] * 32, [None] * 32, [None] * 32, [None] * 32
                            for l in range(32):
                                if bits == 4:
                                    x8 = xv[l][8 * j:8 * j + 8]
                                    bh0[l], bl0[l] = split(x8[2 * st], x8[2 * st + 4])
                                    bh1[l], bl1[l] = split(x8[2 * st + 1], x8[2 * st + 5])
                                else:
                                    x4 = xv[l][4 * j:4 * j + 4]
                                    bh0[l], bl0[l] = split(x4[0], x4[1])
                                    bh1[l], bl1[l] = split(x4[2], x4[3])
                            for t in range(rt):
                                a = []
                                for l in range(32):
                                    if bits == 4:
                                        a.append([nib_pair(q[l, t, 0][j], 2 * st), nib_pair(q[l, t, 1][j], 2 * st),
                                                  nib_pair(q[l, t, 0][j], 2 * st + 1), nib_pair(q[l, t, 1][j], 2 * st + 1)])
                                    else:
                                        a.append([codes8(q[l, t, 0][j], 0), codes8(q[l, t, 1][j], 0),
                                                  codes8(q[l, t, 0][j], 2), codes8(q[l, t, 1][j], 2)])
                                at = [acc[l][t] for l in range(32)]
                                mma(at, a, bh0, bh1)
                                mma(at, a, bl0, bl1)
                    for l in range(32):
                        g = l // 4
                        for t in range(rt):
                            rg = min(r0 + 16 * t + g, out - 1)
                            rg8 = min(r0 + 16 * t + 8 + g, out - 1)
                            s0, b0, s1, b1 = sc[rg][gi], bi[rg][gi], sc[rg8][gi], bi[rg8][gi]
                            yl[l][t][0] += s0 * acc[l][t][0] + b0 * xs0[l]
                            yl[l][t][1] += s0 * acc[l][t][1] + b0 * xs1[l]
                            yl[l][t][2] += s1 * acc[l][t][2] + b1 * xs0[l]
                            yl[l][t][3] += s1 * acc[l][t][3] + b1 * xs1[l]
                g0 += ks * U
            red.append(yl)
        for l in range(32):
            g, c = l // 4, l % 4
            for t in range(rt):
                for i in range(4):
                    v = sum(red[k][l][t][i] for k in range(ks))
                    r, tok = r0 + 16 * t + g + 8 * (i // 2), 2 * c + i % 2
                    if r < out and tok < n_tok:
                        assert y[tok][r] is None, "written twice"
                        y[tok][r] = v
    mx = max(abs(v) for row in ref for v in row)
    md = 0.0
    for t in range(n_tok):
        for r in range(out):
            assert y[t][r] is not None, "row %d token %d not written" % (r, t)
            md = max(md, abs(y[t][r] - ref[t][r]))
    return md / mx

if __name__ == '__main__':
    cases = [(4, 64, 2, 2, 37, 256, 3), (4, 32, 4, 3, 70, 160, 8), (4, 128, 2, 1, 16, 256, 2),
             (8, 64, 2, 2, 33, 192, 5), (8, 128, 4, 1, 64, 256, 8), (8, 32, 2, 4, 20, 128, 7)]
    worst = 0.0
    for i, (bits, group, rt, ks, out, inn, n_tok) in enumerate(cases):
        e = run(bits, group, rt, ks, out, inn, n_tok, i)
        print("bits %d group %3d rt %d ks %d out %3d in %3d tok %d: rel err %.2e" % (bits, group, rt, ks, out, inn, n_tok, e))
        worst = max(worst, e)
    assert worst < 1e-5, worst
    print("ok")
