"""PyTorch's own answer to many small networks: torch.func.

K copies of the same MLP (4-64-64-2, as nn.Sequential) are stacked with
`stack_module_state`; one double-DQN update for all of them is `vmap(grad(loss))` over
the stacked parameters (Huber loss on Q(s, a) against r + discount * Q_target(s',
argmax_a Q_online(s', a)), each agent's batch mean), each agent's gradient clipped to
norm 10, then one Adam (foreach) step over the stacked tensors. The same work as
millrace's stacked update, on batches already in memory, one thread by default.

Usage: python bench/population_vmap.py [--k 8,32,64,256] [--batch 32] [--seconds 2]
                                       [--threads 1] [--loop]
--loop also times the plain answer: a Python loop over K modules and K optimizers.
Prints one line per K: agent-updates/s.
"""

import argparse
import copy
import time

import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
import torch.nn.functional as F


def make():
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def data(k, b):
    return (
        torch.randn(k, b, 4),
        torch.randint(2, (k, b, 1)),
        torch.randn(k, b, 1),
        torch.full((k, b, 1), 0.99),
        torch.randn(k, b, 4),
    )


def timed(step, seconds):
    for _ in range(3):
        step()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    return n / (time.perf_counter() - start)


def stacked(k, b, seconds):
    models = [make() for _ in range(k)]
    params, _ = stack_module_state(models)
    target = {n: p.detach().clone() for n, p in params.items()}
    base = copy.deepcopy(models[0]).to("meta")

    def q(p, x):
        return functional_call(base, (p,), (x,))

    def loss(p, tp, obs, act, rew, disc, nxt):
        q_all = q(p, torch.cat([obs, nxt]))
        q_s, q_n = q_all[: obs.shape[0]], q_all[obs.shape[0]:]
        best = q_n.argmax(-1, keepdim=True)
        y = (rew + disc * q(tp, nxt).gather(-1, best)).detach()
        return F.huber_loss(q_s.gather(-1, act), y)

    grads_of = vmap(grad(loss))
    opt = torch.optim.Adam(params.values(), lr=1e-4, foreach=True)
    batch = data(k, b)

    def step():
        g = grads_of(params, target, *batch)
        norms = torch.sqrt(sum(x.pow(2).flatten(1).sum(1) for x in g.values()))
        scale = (10.0 / norms.clamp_min(10.0))
        for n, p in params.items():
            p.grad = g[n] * scale.view(-1, *([1] * (g[n].dim() - 1)))
        opt.step()

    return timed(step, seconds)


def loop(k, b, seconds):
    models = [make() for _ in range(k)]
    targets = [copy.deepcopy(m) for m in models]
    opts = [torch.optim.Adam(m.parameters(), lr=1e-4) for m in models]
    obs, act, rew, disc, nxt = data(k, b)

    def step():
        for i in range(k):
            q_all = models[i](torch.cat([obs[i], nxt[i]]))
            with torch.no_grad():
                best = q_all[b:].argmax(-1, keepdim=True)
                y = rew[i] + disc[i] * targets[i](nxt[i]).gather(-1, best)
            l = F.huber_loss(q_all[:b].gather(-1, act[i]), y)
            opts[i].zero_grad()
            l.backward()
            nn.utils.clip_grad_norm_(models[i].parameters(), 10.0)
            opts[i].step()

    return timed(step, seconds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", default="8,32,64,256")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loop", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    # As millrace's optimizer does: denormals (decaying Adam moments) are flushed.
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, batch {a.batch}, {a.threads} thread(s)")
    print(f"{'K':>6} {'vmap agent-updates/s':>22}" + (f" {'loop agent-updates/s':>22}" if a.loop else ""))
    for k in (int(x) for x in a.k.split(",")):
        line = f"{k:>6} {k * stacked(k, a.batch, a.seconds):>22.0f}"
        if a.loop:
            line += f" {k * loop(k, a.batch, a.seconds):>22.0f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
