"""The same double-DQN update in idiomatic PyTorch (nn.Sequential, Adam, gradient
clipping, Huber loss) on batches already in memory: the peer for the learner's ceiling
(`cargo bench -p millrace-learner --bench ceiling`). One intra-op thread by default.

    python bench/pytorch_update.py [--hidden 64,64 128,128] [--batch 32 64 512] [--seconds 3]
    python bench/pytorch_update.py --cnn [--batch 32 512]   # the Nature DQN on 4x84x84 uint8
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(obs, hidden, actions):
    layers, width = [], obs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, actions))


def nature_cnn(actions):
    """Mnih et al. 2015, on uint8 frames scaled to [0, 1] (as SB3's NatureCNN)."""
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, actions),
    )


class Scaled(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x.float() / 255.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", nargs="+", default=["64,64", "128,128"])
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 64, 512])
    ap.add_argument("--obs", type=int, default=4)
    ap.add_argument("--actions", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cnn", action="store_true", help="the Nature DQN on 4x84x84 uint8 frames")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s)")
    print(f"{'hidden':<12} {'batch':>6} {'updates/s':>12} {'us/update':>10}")
    for hidden in ["nature-cnn"] if args.cnn else args.hidden:
        sizes = [] if args.cnn else [int(x) for x in hidden.split(",")]
        for b in args.batch:
            if args.cnn:
                net, target = Scaled(nature_cnn(args.actions)), Scaled(nature_cnn(args.actions))
                obs = torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8)
                next_obs = torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8)
            else:
                net, target = mlp(args.obs, sizes, args.actions), mlp(args.obs, sizes, args.actions)
                obs, next_obs = torch.randn(b, args.obs), torch.randn(b, args.obs)
            target.load_state_dict(net.state_dict())
            opt = torch.optim.Adam(net.parameters(), lr=1e-4)
            actions = torch.randint(0, args.actions, (b, 1))
            rewards, discounts = torch.randn(b, 1), torch.full((b, 1), 0.99)

            def update():
                with torch.no_grad():
                    best = net(next_obs).argmax(1, keepdim=True)
                    y = rewards + discounts * target(next_obs).gather(1, best)
                q = net(obs).gather(1, actions)
                loss = F.huber_loss(q, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), 10.0)
                opt.step()

            chunk = 1 if args.cnn else 50
            for _ in range(chunk):
                update()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds or n < 20:
                for _ in range(chunk):
                    update()
                n += chunk
            dt = time.perf_counter() - start
            label = hidden if args.cnn else "x".join(map(str, sizes))
            print(f"{label:<12} {b:>6} {n / dt:>12.1f} {dt * 1e6 / n:>10.1f}")


if __name__ == "__main__":
    main()
