"""What a shared-memory path for big tensors would cost on this machine, next to plain copies.

    python benchmarks/shared_memory.py [--megabytes 100]

A fast path between members on one host would copy a tensor into a shared segment (a
``memfd``, which leaves no file behind and ends with its last holder) and let the
receiver map it: one copy per direction, two per round trip. This measures its parts
in one process, in the same run as the copies it would have to beat: a copy into a
buffer already in use (``copy_``), a copy into a new tensor (``clone``), a copy into a
new ``memfd`` segment, into one already faulted in, and mapping a filled segment
again (what the receiver pays). Target (issue 34): a 100 MiB round trip within 1.3x of
two copies; where one direction's segment costs more than that, the path cannot pay.
"""

import nbrpc  # noqa: F401  # isort: skip  (before torch: its allocator, as in every member)

import argparse
import functools
import mmap
import os
import time

import torch


def best_ms(call, times: int = 3) -> float:
    samples = []
    for _ in range(times):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return min(samples) * 1e3


def segment(nbytes: int, populate: bool) -> tuple[int, mmap.mmap]:
    fd = os.memfd_create("nbrpc-probe", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
    return fd, mmap.mmap(fd, nbytes, flags=flags)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()
    nbytes = args.megabytes * 2**20
    source = torch.ones(nbytes, dtype=torch.uint8)
    target = torch.empty_like(source)
    rows = {"copy_ into a buffer in use": best_ms(lambda: target.copy_(source)),
            "clone (a new tensor)": best_ms(source.clone)}

    def into_new_segment():
        new_fd, new_map = segment(nbytes, populate=False)
        torch.frombuffer(new_map, dtype=torch.uint8).copy_(source)
        new_map.close()
        os.close(new_fd)

    fd, mm = segment(nbytes, populate=True)
    view = torch.frombuffer(mm, dtype=torch.uint8)
    rows["copy into a new memfd segment"] = best_ms(into_new_segment, 1)
    rows["copy into a memfd segment faulted in"] = best_ms(functools.partial(view.copy_, source))

    def map_again():
        again = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        again.close()

    rows["map a filled segment again (receiver)"] = best_ms(map_again)
    del view
    mm.close()
    os.close(fd)
    two_copies = 2 * rows["clone (a new tensor)"]
    best_trip = 2 * (rows["copy into a memfd segment faulted in"] + rows["map a filled segment again (receiver)"])
    print(f"{args.megabytes} MiB on {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for what, ms in rows.items():
        print(f"  {what:<42} {ms:>8.1f} ms")
    print(f"  a round trip through segments, at best  {best_trip:>8.1f} ms "
          f"= {best_trip / two_copies:.1f}x two clones ({two_copies:.1f} ms; target <= 1.3x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
