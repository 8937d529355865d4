# mma_emu: src/kernels/cuda/mma.cu's affine kernel emulated lane by lane in Python (no GPU, no
# numpy): the host's split-K choice, the stages' shared-memory bytes as cp.async fills them,
# ldmatrix.x4 (lane 8 j + i gives row i of matrix j; lane t receives word t % 4 of row t / 4),
# mma.m16n8k16 .row.col bf16 (A, B and C rebuilt from each lane's registers by the PTX ISA's
# fragment tables, multiplied in double), the code-to-bf16 bit tricks and the group epilogue,
# against y = x (s q + b)ᵀ. It checks the kernel's index arithmetic, not PTX semantics or
# races: keep it in step with mma.cu when the tiling changes.
#   python3 dev/kernels/mma_emu.py      (a few seconds; each shape prints its rel err)
import random, struct, sys

def f2bf_bits(v):  # round to nearest even
    u = struct.unpack('<I', struct.pack('<f', v))[0]
    r = ((u >> 16) & 1) + 0x7fff
    return ((u + r) >> 16) & 0xffff

def bf2f(h):
    return struct.unpack('<f', struct.pack('<I', (h & 0xffff) << 16))[0]

def f32(v):
    return struct.unpack('<f', struct.pack('<f', v))[0]

def u32_of_f(v):
    return struct.unpack('<I', struct.pack('<f', v))[0]

def f_of_u32(u):
    return struct.unpack('<f', struct.pack('<I', u & 0xffffffff))[0]

def byte_perm(x, y, s):
    b = [(x >> (8 * i)) & 0xff for i in range(4)] + [(y >> (8 * i)) & 0xff for i in range(4)]
    r = 0
    for i in range(4):
        r |= b[(s >> (4 * i)) & 7] << (8 * i)
    return r

def codes4_bf16(v, sh):
    b = v >> sh
    r = (b & 0xf) | (b & 0xf0) << 12 | 0x43004300
    lo = bf2f(r & 0xffff) - 128.0
    hi = bf2f(r >> 16) - 128.0
    return f2bf_bits(lo) | f2bf_bits(hi) << 16

def codes8_bf16(v, k):
    f0 = f_of_u32(byte_perm(v, 0x4B000000, 0x7540 | k)) - 8388608.0
    f1 = f_of_u32(byte_perm(v, 0x4B000000, 0x7540 | (k + 1))) - 8388608.0
    return f2bf_bits(f0) | f2bf_bits(f1) << 16

MMA_BN, MMA_KS, MMA_STAGES, MMA_XROW, MMA_MAX_Z = 128, 32, 4, 40, 16

def rd32(mem, a):
    return mem[a] | mem[a + 1] << 8 | mem[a + 2] << 16 | mem[a + 3] << 24

def ldmatrix_x4(mem, addrs):
    # matrix j: rows from lanes 8j..8j+7; thread t gets row t/4, elements 2(t%4), +1
    out = [[0] * 4 for _ in range(32)]
    for t in range(32):
        for j in range(4):
            out[t][j] = rd32(mem, addrs[8 * j + t // 4] + 4 * (t % 4))
    return out

def mma(c, a, b):
    # c[lane][4], a[lane][4] regs, b[lane][2] regs; PTX m16n8k16 .row.col bf16 layouts
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for lane in range(32):
        g, tq = lane >> 2, lane & 3
        for i in range(8):  # a0..a7 elements
            reg = a[lane][i // 2]
            v = bf2f((reg >> (16 * (i & 1))) & 0xffff)
            row = g if (i < 2 or 4 <= i < 6) else g + 8
            col = tq * 2 + (i & 1) + (8 if i >= 4 else 0)
            A[row][col] = v
        for i in range(4):  # b0..b3
            reg = b[lane][i // 2]
            v = bf2f((reg >> (16 * (i & 1))) & 0xffff)
            row = tq * 2 + (i & 1) + (8 if i >= 2 else 0)
            B[row][g] = v
    for lane in range(32):
        g, tq = lane >> 2, lane & 3
        for i in range(4):
            row = g if i < 2 else g + 8
            col = tq * 2 + (i & 1)
            c[lane][i] += sum(A[row][k] * B[k][col] for k in range(16))

def run(bits, group, sdt_round, out, inn, n_tok, n_sm=132, seed=1):
    rnd = random.Random(seed)
    ng = inn // group
    q = [[rnd.randrange(1 << bits) for _ in range(inn)] for _ in range(out)]
    s = [[sdt_round(rnd.uniform(0.001, 0.05)) for _ in range(ng)] for _ in range(out)]
    bb = [[sdt_round(rnd.uniform(-0.3, 0.3)) for _ in range(ng)] for _ in range(out)]
    x = [[f32(rnd.uniform(-1, 1)) for _ in range(inn)] for _ in range(n_tok)]
    # MLX packing: little-endian bit stream per row
    row_bytes = inn * bits // 8
    data = bytearray(out * row_bytes)
    for r in range(out):
        acc = 0
        for k in range(inn):
            acc |= q[r][k] << (k * bits)
        data[r * row_bytes:(r + 1) * row_bytes] = acc.to_bytes(row_bytes, 'little')
    # prep
    xh = [[f2bf_bits(v) for v in row] for row in x]
    xl = [[f2bf_bits(x[t][k] - bf2f(xh[t][k])) for k in range(inn)] for t in range(n_tok)]
    xs = [[sum(x[t][gi * group:(gi + 1) * group]) for gi in range(ng)] for t in range(n_tok)]
    # host
    nk = inn // MMA_KS
    wm_ = 1 if n_tok <= 32 else 2
    bm = 32 * wm_
    bx = (out + MMA_BN - 1) // MMA_BN
    by = (n_tok + bm - 1) // bm
    blocks = bx * by
    target = 8 // (4 * wm_) * n_sm
    nz = 1
    if 2 * blocks <= target:
        zmax = min(min(ng // 2, nk // 4), MMA_MAX_Z)
        nz = min(max(zmax, 1), target // blocks)
    gpz = (ng + nz - 1) // nz
    nz = (ng + gpz - 1) // gpz
    part = [[[None] * out for _ in range(n_tok)] for _ in range(nz)]
    THREADS = 128 * wm_
    WROW = 16 if bits == 4 else 48
    XBYTES = 2 * bm * MMA_XROW * 2
    STAGE = XBYTES + MMA_BN * WROW
    spg = group // MMA_KS
    for bz in range(nz):
        for by_ in range(by):
            for bx_ in range(bx):
                smem = bytearray(MMA_STAGES * STAGE)
                n0, m0 = bx_ * MMA_BN, by_ * bm
                g_lo = bz * gpz
                g_hi = min(ng, g_lo + gpz)
                k_lo = g_lo * spg
                steps = max(g_hi - g_lo, 0) * spg

                def load(st, ks):
                    sp = st * STAGE
                    k0 = ks * MMA_KS
                    for tid in range(THREADS):
                        i = tid
                        while i < 2 * bm * 4:
                            p, row, c = i // (bm * 4), i // 4 % bm, i % 4
                            t = m0 + row
                            dst = sp + (p * bm + row) * MMA_XROW * 2 + 16 * c
                            pl = xl if p else xh
                            tt = min(t, n_tok - 1)
                            for e in range(8):
                                v = pl[tt][k0 + 8 * c + e] if t < n_tok else 0
                                smem[dst + 2 * e] = v & 0xff
                                smem[dst + 2 * e + 1] = v >> 8
                            i += THREADS
                        CPR = bits // 4
                        i = tid
                        while i < MMA_BN * CPR:
                            row, c, r = i // CPR, i % CPR, n0 + i // CPR
                            src = min(r, out - 1) * row_bytes + ks * (4 * bits) + 16 * c
                            dst = sp + XBYTES + row * WROW + 16 * c
                            for e in range(16):
                                smem[dst + e] = data[src + e] if r < out else 0
                            i += THREADS

                nw = THREADS // 32
                acc = [[[[0.0] * 4 for _ in range(32)] for _ in range(4)] for _ in range(2 * nw)]
                yo = [[[[0.0] * 4 for _ in range(32)] for _ in range(4)] for _ in range(2 * nw)]
                # index: acc[wid*2+mi][ni][lane][e]
                for s_ in range(MMA_STAGES - 1):
                    if s_ < steps:
                        load(s_, k_lo + s_)
                for kt in range(steps):
                    if kt + MMA_STAGES - 1 < steps:
                        # the emulation is sequential: the slot refilled is step kt - 1's,
                        # so loading it now (before step kt's products) is what the GPU does
                        load((kt + MMA_STAGES - 1) % MMA_STAGES, k_lo + kt + MMA_STAGES - 1)
                    sp = (kt % MMA_STAGES) * STAGE
                    gend = (kt + 1) % spg == 0
                    grp = g_lo + kt // spg
                    for wid in range(nw):
                        wm, wn = wid // 4, wid % 4
                        bq = [[[0] * 4 for _ in range(4)] for _ in range(32)]
                        for lane in range(32):
                            g, tq = lane // 4, lane % 4
                            for ni in range(4):
                                wr = sp + XBYTES + (wn * 32 + ni * 8 + g) * WROW
                                if bits == 4:
                                    v = [rd32(smem, wr + 4 * j) for j in range(4)]
                                    for j in range(4):
                                        bq[lane][ni][j] = codes4_bf16(v[j], 8 * tq)
                                else:
                                    v = [rd32(smem, wr + 4 * j) for j in range(8)]
                                    odd = tq >= 2
                                    kb = 2 * (tq & 1)
                                    bq[lane][ni][0] = codes8_bf16(v[1] if odd else v[0], kb)
                                    bq[lane][ni][1] = codes8_bf16(v[3] if odd else v[2], kb)
                                    bq[lane][ni][2] = codes8_bf16(v[5] if odd else v[4], kb)
                                    bq[lane][ni][3] = codes8_bf16(v[7] if odd else v[6], kb)
                        for h in range(2):
                            a = {}
                            for p in range(2):
                                for mi in range(2):
                                    addrs = []
                                    for lane in range(32):
                                        row = p * bm + wm * 32 + mi * 16 + lane % 16
                                        addrs.append(sp + (row * MMA_XROW + 16 * h + 8 * (lane // 16)) * 2)
                                    a[p, mi] = ldmatrix_x4(smem, addrs)
                            for mi in range(2):
                                for ni in range(4):
                                    for p in range(2):
                                        bl = [[bq[lane][ni][2 * h], bq[lane][ni][2 * h + 1]] for lane in range(32)]
                                        mma(acc[wid * 2 + mi][ni], a[p, mi], bl)
                        if gend:
                            for lane in range(32):
                                g, tq = lane // 4, lane % 4
                                sc = [[0] * 2 for _ in range(4)]
                                bi = [[0] * 2 for _ in range(4)]
                                sx = [[0] * 2 for _ in range(2)]
                                for ni in range(4):
                                    for e in range(2):
                                        r = min(n0 + wn * 32 + ni * 8 + 2 * tq + e, out - 1)
                                        sc[ni][e] = s[r][grp]
                                        bi[ni][e] = bb[r][grp]
                                for mi in range(2):
                                    for e in range(2):
                                        t = m0 + wm * 32 + mi * 16 + g + 8 * e
                                        sx[mi][e] = xs[t][grp] if t < n_tok else 0.0
                                for mi in range(2):
                                    for ni in range(4):
                                        for e in range(4):
                                            yo[wid * 2 + mi][ni][lane][e] += sc[ni][e & 1] * acc[wid * 2 + mi][ni][lane][e] + bi[ni][e & 1] * sx[mi][e >> 1]
                                            acc[wid * 2 + mi][ni][lane][e] = 0.0
                for wid in range(nw):
                    wm, wn = wid // 4, wid % 4
                    for lane in range(32):
                        g, tq = lane // 4, lane % 4
                        for mi in range(2):
                            for ni in range(4):
                                for e in range(4):
                                    t = m0 + wm * 32 + mi * 16 + g + 8 * (e >> 1)
                                    r = n0 + wn * 32 + ni * 8 + 2 * tq + (e & 1)
                                    if t < n_tok and r < out:
                                        assert part[bz][t][r] is None, "written twice"
                                        part[bz][t][r] = yo[wid * 2 + mi][ni][lane][e]
    worst, mx = 0.0, 0.0
    for t in range(n_tok):
        for r in range(out):
            vals = [part[z][t][r] for z in range(nz)]
            assert all(v is not None for v in vals), ("unwritten", t, r)
            y = sum(vals)
            ref = sum((s[r][k // group] * q[r][k] + bb[r][k // group]) * x[t][k] for k in range(inn))
            mx = max(mx, abs(ref))
            worst = max(worst, abs(y - ref))
    print(f"bits {bits} group {group} out {out} in {inn} n_tok {n_tok}: nz {nz} wm {wm_} rel err {worst / mx:.2e}")
    assert worst / mx < 1e-5

bf = lambda v: bf2f(f2bf_bits(v))
run(4, 32, bf, 140, 256, 37)           # WM 2, two row tiles, split K
run(8, 64, bf, 131, 512, 20)           # WM 1, 8-bit, spg 2
run(4, 128, f32, 9, 512, 35, n_sm=1)   # whole K (target 1 block), spg 4
run(8, 32, bf, 33, 96, 70, n_sm=1)     # three token tiles, no split
