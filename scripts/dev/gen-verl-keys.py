"""Write dynres-core's list of verl config keys from an installed verl (run after a verl upgrade).

Composes verl's shipped fully-async trainer config with Hydra, adds the keys of verl's generated
Megatron trainer config (verl 0.9.1's fully-async Megatron config names its search path relative
to the working directory, so Hydra cannot compose it from elsewhere), and writes every dotted
key to packages/dynres-core/src/dynres/core/verl_keys.txt, one per line;
a key whose value is an empty mapping is written with a trailing ``.*`` (verl accepts anything
below it). dynres uses the list to tell verl's keys it does not model from typos.

    .venv/bin/python scripts/dev/gen-verl-keys.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

CONFIG = "fully_async_ppo_trainer"
MEGATRON = "trainer/config/_generated_ppo_megatron_trainer.yaml"
OUT = Path(__file__).resolve().parents[2] / "packages/dynres-core/src/dynres/core/verl_keys.txt"


def walk(node: Any, prefix: str, out: set[str]) -> None:
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and not value:
            out.add(path + ".*")
        out.add(path)
        walk(value, path + ".", out)


def main() -> int:
    import verl
    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    root = os.path.dirname(verl.__file__)
    keys: set[str] = set()
    with initialize_config_dir(
        config_dir=os.path.join(root, "experimental/fully_async_policy/config"), version_base=None
    ):
        cfg = compose(config_name=CONFIG)
    walk(OmegaConf.to_container(cfg, resolve=False), "", keys)
    with open(os.path.join(root, MEGATRON), encoding="utf-8") as f:
        walk(yaml.safe_load(f), "", keys)
    header = f"# verl {verl.__version__} config keys ({CONFIG} + {MEGATRON}); written by scripts/dev/gen-verl-keys.py\n"
    OUT.write_text(header + "".join(f"{k}\n" for k in sorted(keys)), encoding="utf-8")
    print(f"{len(keys)} keys -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
