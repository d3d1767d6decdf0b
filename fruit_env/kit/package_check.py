"""The child process that checks a compiled package before any process trusts it.

A package is native code: loading or running a bad one (a loader/ABI mismatch, a driver fault)
can kill the process with a signal that no `try` catches. So `fruit_env.kit.proof` runs this
file in a child process, by path: it imports torch alone, loads the package through torch's
public loader, replays the recorded steps through the same entry point the env calls
(`loader.boxed_run`, the state rewritten in place) and compares every output and the state
after each step with the eager step's, bit for bit. Its exit status is the verdict: 0 equal,
3 different games (the first difference on stdout); anything else, a signal included, is a
failure the parent reports.

    python package_check.py PACKAGE CASES DEVICE
"""

from __future__ import annotations

import sys

DIFFERENT = 3  # the exit status for "it ran, and played other games"


def main(argv: list[str]) -> int:
    import torch
    from torch._inductor import aoti_load_package

    package, cases_file, device_name = argv
    device = torch.device(device_name)
    cases = torch.load(cases_file, weights_only=True)
    index = device.index if device.type == "cuda" and device.index is not None else -1
    loader = aoti_load_package(package, device_index=index).loader
    rows, key, counter = (cases[name].to(device) for name in ("rows", "key", "counter"))
    for step, (action, expected) in enumerate(zip(cases["actions"], cases["outputs"], strict=True)):
        out = loader.boxed_run([rows, key, counter, action.to(device)])
        got = [*out, rows, counter]
        if len(got) != len(expected):
            print(f"step {step}: {len(got)} outputs, the eager step gives {len(expected)}")
            return DIFFERENT
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b)
            if not same:
                print(f"step {step}, output {i}: differs from the eager step's")
                return DIFFERENT
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    print(f"{len(cases['actions'])} steps equal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
