"""Tabulates bench/atari_actor.sh's JSON lines (argument: the .jsonl file)."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'implementation':<34} {'env':<26} {'envs':>5} {'thr':>4} {'proc':>5} {'steps/s':>9}")
for r in rows:
    what = {
        ("millrace", "env"): "millrace env alone (ale-py C++)",
        ("millrace", "actor"): "millrace actor (Rust CNN)",
        ("ale-vector", "env"): "ale-py AtariVectorEnv, Python",
        ("ale-vector", "actor"): "ale-py vector + PyTorch CNN",
        ("gymnasium", "env"): "Gymnasium wrappers loop",
        ("gymnasium", "actor"): "Gymnasium loop + PyTorch CNN",
    }[(r["impl"], r["mode"])]
    print(f"{what:<34} {r['env']:<26} {r['envs']:>5} {r['threads']:>4} "
          f"{r.get('processes', 1):>5} {r['steps_per_s']:>9.0f}")
