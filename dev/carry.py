"""Split a file into pieces small enough to carry, and join them back with a hash check.

    python dev/carry.py embedded --to .dev   # the embedded model's pieces, tokenizer, gguf wheel,
                                             # GSM8K's files (beside piece 2)
    python dev/carry.py split FILE --parts 2 --to .dev     # .dev/a/FILE.part1, .dev/b/FILE.part2
    python dev/carry.py join .dev/a .dev/b --to FILE         # checks the sha256 split wrote

The GPU machines lent to this project take at most 64 MiB per call and reach no model hub, while
the embedded model's GGUF file is 94 MiB. So it travels in two calls made back to back: the first
carries piece 1 and copies it to /tmp, which stays while the machine is warm (a carried folder
does not: the next call's tree replaces it); the second carries piece 2 and joins them
(dev/notes/gpu.md has the two commands). Piece k goes to its own folder (a, b, ...), so each call
carries one folder. Every folder also holds the whole file's sha256 and the number of pieces, so
`join` refuses a file rebuilt from a stale, truncated or missing piece. `embedded` also puts what
the GPU machine lacks into the first folder: the converted tokenizer (so that the first call runs
dev/lab/roofline.py, which needs it, before the model is whole), the `gguf` wheel (the one-time
conversion reads the file with it) and TRL's wheels with the three packages of its that the machine
lacks (bench/trl_vs_mathrl.py --device cuda; 1.8 MB together, for its Python 3.12).
"""

import argparse
import hashlib
import string
import sys
from pathlib import Path

CHUNK = 1 << 20  # read and hash 1 MiB at a time
# TRL and what it needs that the lent machines lack (they have pyarrow, fsspec, huggingface_hub)
TRL_WHEELS = ["trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19"]
PIP_FOR_THE_GPU = ["--only-binary=:all:", "--no-deps", "--python-version", "3.12",
                   "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                   "--platform", "manylinux2014_x86_64"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def split(path, parts, to):
    """Write `path` as `parts` pieces of (almost) equal size, piece k in `to`/<k-th letter>/, each
    folder with the sha256 of the whole file. -> the pieces' paths."""
    path, to = Path(path), Path(to)
    size = path.stat().st_size
    per = -(-size // parts)  # the last piece is the short one
    digest = sha256(path)
    written = []
    with open(path, "rb") as f:
        for k in range(parts):
            folder = to / string.ascii_lowercase[k]
            folder.mkdir(parents=True, exist_ok=True)
            piece = folder / f"{path.name}.part{k + 1}"
            piece.write_bytes(f.read(per))
            # the digest and the number of pieces: a file rebuilt from fewer is refused
            (folder / f"{path.name}.sha256").write_text(f"{digest} {parts}\n")
            written.append(piece)
    return written


def join(folders, target):
    """Concatenate the pieces found in `folders` (in the order of their part numbers) into
    `target`, and check the result against the sha256 written by split. -> target."""
    pieces = sorted((p for d in folders for p in Path(d).glob("*.part*")),
                    key=lambda p: int(p.name.rsplit(".part", 1)[1]))
    if not pieces:
        sys.exit(f"error: no *.partN files in {', '.join(map(str, folders))}")
    numbers = [int(p.name.rsplit(".part", 1)[1]) for p in pieces]
    name = pieces[0].name.rsplit(".part", 1)[0]
    expected, parts = (pieces[0].parent / f"{name}.sha256").read_text().split()
    if numbers != list(range(1, int(parts) + 1)):
        sys.exit(f"error: pieces {numbers} found; expected 1..{parts} (was the machine given back "
                 "between the two calls?)")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as out:
        for piece in pieces:
            out.write(piece.read_bytes())
    if sha256(tmp) != expected:
        tmp.unlink()
        sys.exit(f"error: the joined {name} does not match its sha256 ({expected[:12]}...): "
                 "a piece is stale or truncated; split the file again")
    tmp.replace(target)
    return target


def embedded(to):
    """The embedded model's GGUF in two pieces under `to`/a and `to`/b, the tokenizer in
    `to`/a/cache/<model>/ (a folder that MATHRL_CACHE can point at), and the gguf and TRL wheels
    in `to`/a/whl/."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import shutil
    import subprocess

    from common.models.loading import EMBEDDED_MODEL, _find_gguf, embedded_tokenizer_dir

    pieces = split(_find_gguf(), 2, to)
    # GSM8K's two files (4.9 MB) beside piece 2, for the device check's gsm8k_curve stage: the
    # lent machines reach no dataset hub
    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    for name in ("gsm8k_train.jsonl", "gsm8k_test.jsonl"):
        if (data / name).is_file():
            (Path(to) / "b" / "data").mkdir(parents=True, exist_ok=True)
            shutil.copy(data / name, Path(to) / "b" / "data" / name)
    tokenizer = Path(to) / "a" / "cache" / EMBEDDED_MODEL
    tokenizer.mkdir(parents=True, exist_ok=True)
    for f in embedded_tokenizer_dir().iterdir():
        if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
            shutil.copy(f, tokenizer / f.name)
    from importlib.metadata import version

    wheel = f"gguf=={version('gguf')}"  # the release that converted it here
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "-d", str(Path(to) / "a" / "whl"), wheel], check=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", *PIP_FOR_THE_GPU,
                    "-d", str(Path(to) / "a" / "whl"), *TRL_WHEELS], check=True)
    return pieces


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("split", help="FILE into --parts pieces under --to/a, --to/b, ...")
    s.add_argument("file")
    s.add_argument("--parts", type=int, default=2)
    s.add_argument("--to", required=True)
    j = sub.add_parser("join", help="the pieces in FOLDERS into --to, checking the sha256")
    j.add_argument("folders", nargs="+")
    j.add_argument("--to", required=True)
    e = sub.add_parser("embedded", help="what a GPU machine needs to run the embedded model")
    e.add_argument("--to", required=True)
    args = p.parse_args()
    if args.verb == "embedded":
        embedded(args.to)
        for folder in sorted(Path(args.to).iterdir()):
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            print(f"{folder}: {size / 2**20:.1f} MiB (one call carries it)")
    elif args.verb == "split":
        for piece in split(args.file, args.parts, args.to):
            print(f"{piece} ({piece.stat().st_size / 2**20:.1f} MiB)")
    else:
        target = join(args.folders, args.to)
        print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB, sha256 checked")


if __name__ == "__main__":
    main()
