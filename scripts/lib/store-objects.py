#!/usr/bin/env python3
"""Lists the objects of a checkpointfs store directory (STATE/backups) for the benchmarks.

One line per stored object, files and pack entries alike (an entry found twice is listed
twice: that is what "no duplicates" checks):
    <name> <content bytes> <sha256 of the content> <file|pack>
The pack format is in src/history/store/pack.rs: entries of MAGIC "cpo1", a u32 LE length,
the SHA-256, then the data; a walk stops at the first entry that is not whole.
With --allocated, prints only the bytes the store's files occupy on disk (st_blocks).
"""
import hashlib
import os
import re
import struct
import sys

HEADER = 40


def objects(store):
    for n in sorted(os.listdir(store)):
        p = os.path.join(store, n)
        if re.fullmatch(r"[0-9a-f]{64}", n):
            h = hashlib.sha256()
            size = 0
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    size += len(chunk)
            yield n, size, h.hexdigest(), "file"
        elif re.fullmatch(r"pack-[0-9]{8}", n):
            with open(p, "rb") as f:
                data = f.read()
            at = 0
            while at + HEADER <= len(data):
                magic, length = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
                name = data[at + 8:at + 40].hex()
                if magic != b"cpo1" or at + HEADER + length > len(data):
                    break
                content = data[at + HEADER:at + HEADER + length]
                yield name, length, hashlib.sha256(content).hexdigest(), "pack"
                at += HEADER + length


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("usage: store-objects.py [--allocated] STATE/backups")
        return 0 if args else 2
    if args[0] == "--allocated":
        store = args[1]
        print(sum(os.stat(os.path.join(store, n)).st_blocks * 512
                  for n in os.listdir(store)
                  if re.fullmatch(r"[0-9a-f]{64}|pack-[0-9]{8}", n)))
        return 0
    for name, size, digest, kind in objects(args[0]):
        print(name, size, digest, kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
