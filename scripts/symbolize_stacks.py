"""Names for the frames of a stripped binary's stacks, as scripts/gpu-probe.sh takes them on the GPU
machine (gdb's `thread apply all bt`, frames printed as `#N 0xADDR in ?? ()`), from the unstripped
binary they were stripped from (strip moves no code). MAPS holds the binary's first mapping in
/proc/PID/maps: its start is the load address subtracted from each frame's. Frames of other
libraries are printed as they are. Needs binutils' addr2line.

    python3 scripts/symbolize_stacks.py STACK MAPS BINARY
"""
import re
import subprocess
import sys

FRAME = re.compile(r"(#\d+)\s+0x([0-9a-f]+) in \?\? \(\)$")
# nested generic arguments shortened to <..>
GENERICS = re.compile(r"<[^<>]*(<[^<>]*(<[^<>]*>[^<>]*)*>[^<>]*)*>")


def main():
    stack, maps, binary = sys.argv[1:4]
    base = int(open(maps).read().split("-")[0], 16)
    lines = open(stack).read().splitlines()
    offsets = sorted({int(m.group(2), 16) - base for m in map(FRAME.match, lines) if m})
    offsets = [o for o in offsets if o >= 0]
    out = subprocess.run(["addr2line", "-f", "-C", "-e", binary] + [hex(o) for o in offsets],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    names = {o: out[2 * i] for i, o in enumerate(offsets)}
    for line in lines:
        m = FRAME.match(line)
        if m:
            name = names.get(int(m.group(2), 16) - base, line)
            print(m.group(1), GENERICS.sub("<..>", name)[:170])
        else:
            print(line[:170])


if __name__ == "__main__":
    main()
