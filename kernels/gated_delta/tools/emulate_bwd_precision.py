"""Precision model of the gated delta backward (issue #6), float64 with chosen operand rounding.

Runs the backward the way the kernels decompose it -- the h recompute and the reverse dh pass
(gdn_seq.cu), then bwd_chunk's V-loop products, dV, the WY part and the dgamma sums (gdn_bwd.cu)
-- in float64, and rounds chosen operands as a storage format would:
  V-loop operands (S0, dS_C, Delta, dDelta; T in dV; dO, v): exact | bf16x2 (the kernels' hi/lo
    split) | fp16s (fp16 after a power-of-2 scale per (chunk, 32-wide V slice)) | bf16
  rec: the operands of the sequential passes on fp16 too ('h', 'dh'; per-column scales on the
    V-side operands, one scale per left matrix)
  recf: the h recompute's operands one by one, (S, Y, T, D') each '-' (exact) | 'fp16' (scaled as
    rec) | 'fp16x2' (scaled, then fp16 hi + fp16 lo: 22 bits), for a register-state recompute
    that must fit beside the fp16 reverse pass (session 15: fp16 states fail dA_log)
  fp16g / fp16x2g: one scale per 16-column group (a warp's tile in the register-state kernels)
  ops: per V-loop operand ('S0', 'dSC', 'D', 'dD', 'dO', 'v' -> format; 'frob': 'exact' sums
    <S0, dS_C> unrounded); fp16x2s: fp16 hi + lo at one power-of-2 scale per slice (22 bits).
  states: each sequence starts from an initial state h0 and gets a final-state gradient dht
    (dh0 is reported too). Where those dominate (many short sequences: test_gated_delta's
    many_seqs_hv3_fused_states) single fp16 S0 and dS_C planes cost far more than without them
    (session 24: dA_log 4e-5 -> 2e-3 on the H200, v64 removed; 'single' shows it)
and reports the worst relative error (||x - exact|| / ||exact||, as test_gated_delta) of every
gradient over 8 seeds, for the `qrun check` strong-gate case and for mild gates (run() also takes
'near0': test_gated_delta's gate_kind 0 with the fused gate; session 16 used it), lens
[1, 2, 3, 63, 64, 65, 200], q/k l2norm, fused gate and beta sigmoid.

  .venv/bin/python kernels/gated_delta/tools/emulate_bwd_precision.py          # the table
  .venv/bin/python kernels/gated_delta/tools/emulate_bwd_precision.py recf     # the recompute's operands one by one
  .venv/bin/python kernels/gated_delta/tools/emulate_bwd_precision.py single   # v64: single fp16 planes, operand by operand
  .venv/bin/python kernels/gated_delta/tools/emulate_bwd_precision.py check    # exact model vs
      torch autograd of the token loop (fails unless they agree to 1e-10; a ctest)

It is how the choice of which backward operands may be fp16 was made (the precision contract
in docs/PERF.md).
"""
import numpy as np, sys, torch
C, K, V, BV = 64, 128, 128, 32

def bf16(x):
    x = np.asarray(x, np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)

def fmt_round(x, fmt):
    if fmt == 'exact': return x
    if fmt == 'bf16': return bf16(x)
    if fmt == 'bf16x2':  # the product uses hi*hi + hi*lo + lo*hi: error ~ lo*lo, model as hi+lo rounding
        hi = bf16(x); lo = bf16(x - hi); return hi + lo
    if fmt == 'fp16s':  # per 32-column slice: scale so max |x| -> [2^14, 2^15), round to fp16, unscale
        y = np.empty_like(x)
        for s in range(0, x.shape[1], BV):
            blk = x[:, s:s + BV]; m = np.abs(blk).max()
            if m == 0: y[:, s:s + BV] = 0; continue
            e = 14 - int(np.floor(np.log2(m)))
            y[:, s:s + BV] = (blk * 2.0 ** e).astype(np.float16).astype(np.float64) * 2.0 ** -e
        return y
    if fmt == 'fp16x2s':  # v64 option: hi = fp16s(x), lo = fp16 of the remainder at the same slice scale
        y = np.empty_like(x)
        for s in range(0, x.shape[1], BV):
            blk = x[:, s:s + BV]; m = np.abs(blk).max()
            if m == 0: y[:, s:s + BV] = 0; continue
            e = 14 - int(np.floor(np.log2(m))); z = blk * 2.0 ** e
            hi = z.astype(np.float16).astype(np.float64); lo = (z - hi).astype(np.float16).astype(np.float64)
            y[:, s:s + BV] = (hi + lo) * 2.0 ** -e
        return y
    if fmt == 'fp16c':  # per column: scale so max |x[:, j]| -> [2^14, 2^15), fp16, unscale
        m = np.abs(x).max(axis=0)
        e = np.where(m > 0, 14 - np.floor(np.log2(np.where(m > 0, m, 1))), 0)
        return (x * 2.0 ** e).astype(np.float16).astype(np.float64) * 2.0 ** -e
    if fmt == 'fp16m':  # one scale for the whole matrix
        m = np.abs(x).max()
        if m == 0: return x
        e = 14 - int(np.floor(np.log2(m)))
        return (x * 2.0 ** e).astype(np.float16).astype(np.float64) * 2.0 ** -e
    if fmt in ('fp16g', 'fp16x2g'):  # one scale per 16-column group (a warp's tile in the register-state kernels)
        y = np.empty_like(x)
        for c0 in range(0, x.shape[1], 16):
            y[:, c0:c0 + 16] = fmt_round(x[:, c0:c0 + 16], 'fp16m' if fmt == 'fp16g' else 'fp16x2m')
        return y
    if fmt in ('fp16x2c', 'fp16x2m'):  # scaled as fp16c / fp16m, then hi = fp16(y), lo = fp16(y - hi)
        m = np.abs(x).max(axis=0) if fmt == 'fp16x2c' else np.abs(x).max()
        e = np.where(m > 0, 14 - np.floor(np.log2(np.where(m > 0, m, 1))), 0)
        y = x * 2.0 ** e
        hi = y.astype(np.float16).astype(np.float64)
        lo = (y - hi).astype(np.float16).astype(np.float64)
        return (hi + lo) * 2.0 ** -e
    raise ValueError(fmt)

def gates(rng, T, kind):
    if kind == 'strong':  # the check's strong case: A_log = log U(8,16), a ~ N(3,1), dt ~ N(0,.5^2)
        A_log = float(bf16(np.log(8 + 8 * rng.random()))); dt = float(bf16(0.5 * rng.standard_normal()))
        a = bf16(3 + rng.standard_normal(T))
    elif kind == 'near0':  # test_gated_delta's gate_kind 0, fused: g ~ -exp(A_log) softplus(a - 8)
        A_log = float(np.log(0.01 + 2 * rng.random())); dt = -8 + float(rng.standard_normal())
        a = bf16(rng.standard_normal(T))
    else:  # logsigmoid(randn)/16-like
        A_log = float(bf16(np.log(0.01 + 2 * rng.random()))); dt = float(bf16(0.5 * rng.standard_normal()))
        a = bf16(rng.standard_normal(T))
    return A_log, dt, a

def softplus(x): return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))

def run(lens, fmt, seed, kind, fmt_T=None, fmt_io=None, rec='-', wy=None, recf=None, ops=None, states=False):
    rng = np.random.default_rng(seed)
    T = sum(lens)
    qr = bf16(rng.standard_normal((T, K))); kr = bf16(rng.standard_normal((T, K)))
    v = bf16(rng.standard_normal((T, V))); b = bf16(rng.standard_normal(T))
    dO = bf16(rng.standard_normal((T, V)) * 1e-3)
    A_log, dt, a = gates(rng, T, kind)
    q = qr / np.linalg.norm(qr, axis=1, keepdims=True); k = kr / np.linalg.norm(kr, axis=1, keepdims=True)
    beta = 1 / (1 + np.exp(-b)); x = a + dt
    g = -np.exp(A_log) * softplus(x)
    s = K ** -0.5
    # states: each sequence's initial state h0 and final-state gradient dht (as test_gated_delta's
    # cases with h0 and dht: h0 0.3 N(0, 1), dht at dO's scale); drawn last, so that the other
    # inputs stay those of the same seed without states
    h0 = 0.3 * rng.standard_normal((len(lens), K, V)) if states else np.zeros((len(lens), K, V))
    dht = 1e-3 * rng.standard_normal((len(lens), K, V)) if states else np.zeros((len(lens), K, V))
    dh0 = np.zeros((len(lens), K, V))
    R = lambda z: fmt_round(z, fmt)
    # rec ('h', 'dh', 'both' or '-'): the sequential passes' operands on fp16 too (the V-side
    # operand with a scale per column, the 64x64 left matrices with one scale each; the state
    # itself stays exact)
    on_h, on_d = rec in ('h', 'both'), rec in ('dh', 'both')
    Rc = (lambda z: fmt_round(z, 'fp16c')) if on_h else (lambda z: z)
    Rm = (lambda z: fmt_round(z, 'fp16m')) if on_h else (lambda z: z)
    fS = fY = fT = fD = (lambda z: z)
    if recf:  # per operand of the recompute: column scales on S, Y, D'; one scale on T
        pick = lambda f, m: (lambda z: z) if f == '-' else (lambda z: fmt_round(z, (f + m) if f in ('fp16', 'fp16x2') else f))
        fS, fY, fT, fD = pick(recf[0], 'c'), pick(recf[1], 'c'), pick(recf[2], 'm'), pick(recf[3], 'c')
    elif on_h:
        fS = fY = fD = Rc
        fT = Rm
    Dc = (lambda z: fmt_round(z, 'fp16c')) if on_d else (lambda z: z)
    Dm = (lambda z: fmt_round(z, 'fp16m')) if on_d else (lambda z: z)
    # wy: the WY part's fp32-derived operands (Pg, dW, T, dT, M1, Gsym) in this format, one scale
    # per matrix for fp16 ('fp16m')
    Wr = (lambda z: fmt_round(z, wy)) if wy else (lambda z: z)
    RT = (lambda z: fmt_round(z, fmt_T)) if fmt_T else (lambda z: z)
    dq = np.zeros((T, K)); dk = np.zeros((T, K)); dv = np.zeros((T, V)); dgam_all = np.zeros(T); dbeta = np.zeros(T)
    bos = 0
    for si, L0 in enumerate(lens):
        chunks = [(bos + c0, min(C, L0 - c0)) for c0 in range(0, L0, C)]
        # h recompute: states at chunk starts, Delta, per-chunk quantities
        S = h0[si].copy(); st = []
        for t0, L in chunks:
            gam = np.cumsum(g[t0:t0 + L]); Kc = k[t0:t0 + L]; Qc = q[t0:t0 + L]; bc = beta[t0:t0 + L]
            Gm = np.tril(np.exp(np.minimum(gam[:, None] - gam[None, :], 0)))  # incl diag
            A = np.tril(bc[:, None] * (Kc @ Kc.T) * Gm, -1)
            Tm = np.linalg.inv(np.eye(L) + A)
            Y = bc[:, None] * (v[t0:t0 + L] - np.exp(gam)[:, None] * (Kc @ fS(S)))
            D = fT(Tm) @ fY(Y)
            st.append(dict(t0=t0, L=L, gam=gam, Gm=Gm, T=Tm, S0=S.copy(), D=D))
            S = np.exp(gam[-1]) * S + Kc.T @ fD(np.exp(gam[-1] - gam)[:, None] * D)
        # dh pass (reverse)
        dS = dht[si].copy()
        for c in reversed(st):
            t0, L, gam, Gm, Tm = c['t0'], c['L'], c['gam'], c['Gm'], c['T']
            Kc = k[t0:t0 + L]; Qc = q[t0:t0 + L]; bc = beta[t0:t0 + L]; dOc = dO[t0:t0 + L]
            P = (Qc @ Kc.T) * Gm
            dD = np.exp(gam[-1] - gam)[:, None] * (Kc @ Dc(dS)) + s * Dm(P).T @ dOc
            c['dSC'] = dS.copy(); c['dD'] = dD
            Z = -(bc * np.exp(gam))[:, None] * (Dm(Tm).T @ Dc(dD))
            dS = np.exp(gam[-1]) * dS + Qc.T @ Dc(s * np.exp(gam)[:, None] * dOc) + Kc.T @ Dc(Z)
        dh0[si] = dS
        # bwd_chunk, with the V-loop operands rounded
        for c in st:
            t0, L, gam, Gm, Tm = c['t0'], c['L'], c['gam'], c['Gm'], c['T']
            Kc = k[t0:t0 + L]; Qc = q[t0:t0 + L]; bc = beta[t0:t0 + L]; dOc = dO[t0:t0 + L]; vc = v[t0:t0 + L]
            S0, dSC, D, dD = R(c['S0']), R(c['dSC']), R(c['D']), R(c['dD'])
            RO = (lambda z: fmt_round(z, fmt_io)) if fmt_io else (lambda z: z)
            dOr, vr = RO(dOc), RO(vc)
            if ops:  # per V-loop operand: {'S0', 'dSC', 'D', 'dD', 'dO', 'v'} -> format (else fmt / fmt_io)
                f = lambda n, z, d: fmt_round(z, ops[n]) if n in ops else d
                S0, dSC, D, dD = f('S0', c['S0'], S0), f('dSC', c['dSC'], dSC), f('D', c['D'], D), f('dD', c['dD'], dD)
                dOr, vr = f('dO', dOc, dOr), f('v', vc, vr)
            gl = gam[-1]
            aQ = dOr @ S0.T; aKs = D @ dSC.T; aW = dD @ S0.T; aPD = dOr @ D.T; aT = dD @ vr.T
            frob = np.sum(S0 * dSC) if not (ops and ops.get('frob') == 'exact') else np.sum(c['S0'] * c['dSC'])
            TtdD = RT(Tm).T @ dD
            dbp = np.sum(TtdD * vr, axis=1)
            dv[t0:t0 + L] = bc[:, None] * TtdD
            aQ = s * np.exp(gam)[:, None] * aQ
            aKs = np.exp(gl - gam)[:, None] * aKs
            KK = Kc @ Kc.T; QK = Qc @ Kc.T
            Pg = s * aPD * Gm
            rq = np.sum(aQ * Qc, 1); rks = np.sum(aKs * Kc, 1)
            E = Pg * QK
            e = np.array([E[r, :r].sum() - E[r + 1:, r].sum() for r in range(L)])
            dgam = rq + e
            dQ = aQ + Wr(Pg) @ Kc
            dKd = aKs + Wr(Pg).T @ Qc
            dW = -aW
            dT = np.tril(aT * bc[None, :] + (Wr(dW) @ Kc.T) * (bc * np.exp(gam))[None, :], -1)
            TtdW = Wr(Tm).T @ Wr(dW)
            dKd = dKd + (bc * np.exp(gam))[:, None] * TtdW
            w = np.sum(TtdW * Kc, 1)
            dbt = dbp + np.exp(gam) * w
            dgam = dgam + bc * np.exp(gam) * w
            M1 = Wr(dT) @ Wr(Tm).T
            G = np.tril(-(Wr(Tm).T @ Wr(M1)) * Gm, -1)
            sb = np.array([(G[r, :r] * KK[r, :r]).sum() for r in range(L)])
            sc = np.array([(G[r + 1:, r] * bc[r + 1:] * KK[r + 1:, r]).sum() for r in range(L)])
            dbt = dbt + sb
            dgam = dgam + bc * sb - sc
            Gsym = bc[:, None] * G + G.T * bc[None, :]
            dKd = dKd + Wr(Gsym) @ Kc
            kk = np.where(np.arange(L) < L - 1, rks, 0.0)
            dgam = dgam - kk
            dgam[L - 1] += np.exp(gl) * frob + kk.sum()
            dgam_all[t0:t0 + L] = np.cumsum(dgam[::-1])[::-1]
            dbeta[t0:t0 + L] = dbt
            # l2norm backward: dx = (dy - (dy.y) y) / ||x||
            nq = np.linalg.norm(qr[t0:t0 + L], axis=1, keepdims=True); nk = np.linalg.norm(kr[t0:t0 + L], axis=1, keepdims=True)
            dq[t0:t0 + L] = (dQ - np.sum(dQ * Qc, 1, keepdims=True) * Qc) / nq
            dk[t0:t0 + L] = (dKd - np.sum(dKd * Kc, 1, keepdims=True) * Kc) / nk
        bos += L0
    sp = softplus(x); sg = 1 / (1 + np.exp(-x))
    da = -dgam_all * np.exp(A_log) * np.where(x > 20, 1.0, sg)
    out = dict(dq=dq, dk=dk, dv=dv, da=da, db=dbeta * beta * (1 - beta),
               dA_log=np.array([np.sum(dgam_all * (-np.exp(A_log) * sp))]), ddt=np.array([da.sum()]))
    if states: out['dh0'] = dh0
    ins = dict(qr=qr, kr=kr, v=v, b=b, a=a, A_log=A_log, dt=dt, dO=dO, h0=h0, dht=dht, states=states)
    return out, ins

def autograd_ref(lens, ins):
    t = lambda z: torch.tensor(z, dtype=torch.float64, requires_grad=True)
    qr, kr, v, b, a = t(ins['qr']), t(ins['kr']), t(ins['v']), t(ins['b']), t(ins['a'])
    A_log, dt = t(np.array(ins['A_log'])), t(np.array(ins['dt']))
    q = qr / qr.norm(dim=1, keepdim=True); k = kr / kr.norm(dim=1, keepdim=True)
    beta = torch.sigmoid(b); g = -A_log.exp() * torch.nn.functional.softplus(a + dt)
    h0 = t(ins['h0'])
    outs = []; bos = 0; tail = 0
    for si, L0 in enumerate(lens):
        S = h0[si]
        for i in range(bos, bos + L0):
            S = g[i].exp() * S
            d = beta[i] * (v[i] - S.T @ k[i])
            S = S + torch.outer(k[i], d)
            outs.append(K ** -0.5 * S.T @ q[i])
        tail = tail + (S * torch.tensor(ins['dht'][si])).sum()  # the final state's loss term
        bos += L0
    O = torch.stack(outs)
    ((O * torch.tensor(ins['dO'])).sum() + tail).backward()
    r = dict(dq=qr.grad.numpy(), dk=kr.grad.numpy(), dv=v.grad.numpy(), da=a.grad.numpy(), db=b.grad.numpy(),
             dA_log=A_log.grad.numpy().reshape(1), ddt=dt.grad.numpy().reshape(1))
    if ins['states']: r['dh0'] = h0.grad.numpy()
    return r

def rel(x, r): return np.linalg.norm(x - r) / max(np.linalg.norm(r), 1e-300)

def worst_of(lens, kind, fmt='bf16x2', states=False, seeds=range(1, 9), **kw):
    """Worst relative error of every gradient over the seeds: run(fmt, **kw) against the exact model."""
    worst = {}
    for seed in seeds:
        ex, _ = run(lens, 'exact', seed, kind, states=states); o, _ = run(lens, fmt, seed, kind, states=states, **kw)
        for n in o: worst[n] = max(worst.get(n, 0), rel(o[n], ex[n]))
    return ' '.join(f'{n}={e:.1e}' for n, e in worst.items())

if __name__ == '__main__':
    lens = [1, 2, 3, 63, 64, 65, 200]
    if sys.argv[1:2] == ['check']:
        bad = 0
        for kind, states in [('strong', False), ('mild', False), ('mild', True)]:
            o, ins = run(lens, 'exact', 1, kind, states=states); r = autograd_ref(lens, ins)
            errs = {n: rel(o[n], r[n]) for n in o}
            print(kind, '+ states' if states else '', 'exact model vs autograd:', ' '.join(f'{n}={e:.1e}' for n, e in errs.items()))
            bad += sum(e > 1e-10 for e in errs.values())
        sys.exit(1 if bad else 0)
    if sys.argv[1:2] == ['recf']:  # which recompute operands need 22 bits (session 15)
        for kind in ['strong', 'mild']:
            for recf in [('-', '-', '-', '-'), ('fp16', 'fp16', 'fp16', 'fp16'), ('fp16x2', 'fp16', 'fp16', 'fp16'),
                         ('fp16x2', 'fp16', 'fp16', 'fp16x2'), ('fp16x2', 'fp16x2', 'fp16', 'fp16x2'),
                         ('fp16x2', 'fp16x2', 'fp16x2', 'fp16x2'), ('fp16', 'fp16x2', 'fp16x2', 'fp16x2')]:
                print(f'{kind:6s} S,Y,T,D\'={",".join(recf):27s} ' + worst_of(lens, kind, recf=recf), flush=True)
        sys.exit(0)
    if sys.argv[1:2] == ['single']:  # v64 (session 24): which V-loop operands may be single fp16 planes
        allf = dict(S0='fp16s', dSC='fp16s', D='fp16s', dD='fp16s', dO='fp16s', v='fp16s')
        # 'short+states': 300 sequences of 1-9 tokens with h0 and dht, mild gates (the kind of
        # test_gated_delta's many_seqs_hv3_fused_states, where v64 lost most)
        short = list(np.random.default_rng(7).integers(1, 10, 300))
        for kind in ['strong', 'mild', 'near0', 'short+states']:
            kl, kk_, kst = (short, 'mild', True) if kind == 'short+states' else (lens, kind, False)
            for name, ops in [('hi/lo (v63)', {}), ('all single', allf), ('Delta fp16x2s (v64)', dict(allf, D='fp16x2s')),
                              ('Delta, S0 fp16x2s', dict(allf, D='fp16x2s', S0='fp16x2s')),
                              ('Delta, dS_C fp16x2s', dict(allf, D='fp16x2s', dSC='fp16x2s'))]:
                print(f'{kind:12s} {name:20s} ' + worst_of(kl, kk_, states=kst, rec='dh', ops=ops), flush=True)
        sys.exit(0)
    for kind in ['strong', 'mild']:
        for fmt, fT, fio, rec, wy in [('bf16x2', None, None, '-', None), ('fp16s', 'fp16s', 'fp16s', '-', None), ('bf16x2', None, None, 'h', None),
                                   ('bf16x2', None, None, 'dh', None), ('fp16s', 'fp16s', 'fp16s', 'dh', None),
                                   ('bf16x2', None, None, '-', 'fp16m'), ('bf16x2', None, None, '-', 'bf16x2'),
                                   ('bf16', None, None, '-', None)]:
            print(f'{kind:6s} {fmt:6s} T:{fT or "-":5s} io:{fio or "-":5s} rec:{rec:4s} wy:{wy or "-":6s} ' +
                  worst_of(lens, kind, fmt, fmt_T=fT, fmt_io=fio, rec=rec, wy=wy), flush=True)
