"""A model checkpoint as content-addressed chunks: what the backend ships to apps, and how an app
puts a download back together, resumably and verified.

A checkpoint folder (config.json, weights, tokenizer and processor files) is described by a
*manifest*: every regular file with its size, SHA-256 and the SHA-256 of each CHUNK_BYTES piece,
plus one `hash` for the whole model (over the sorted (path, size, sha256) list), which is what
`models list` prints and what two machines compare. A download keeps each verified chunk under
`<dest>.partial/` as it arrives, so an interrupted one resumes with what is missing; the files
are assembled and checked against their SHA-256 before the folder takes its final name.
Nothing here does I/O beyond the local disk: the transport asks for chunks by hash.

Everything a server sends is checked before anything is written or removed: a version is a plain
folder name (`is_model_version`), a file path stays inside the model folder and fits the file
system, no chunk is listed twice (one chunk listed 128 times would write 128 copies of it), the
whole model fits `max_bytes`; the staging folder under `<dest>.partial/` holds no links.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path, PurePosixPath

from agent.errors import TandemError

CHUNK_BYTES = 8 * 2**20  # well under the protocol's 64 MiB blob limit; the unit of resume
MANIFEST_FILE = ".tandem_model.json"  # written beside a pulled model's files (not part of the model)
_HASH = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # the flywheel's are v0001, v0002, ...
# the small model shipped in the repository, built by `train default`: the one place its path is written
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "default_model"
DEFAULT_MAX_PULL_BYTES = 16 * 2**30  # the most a pull writes unless told otherwise (a 7B model in bf16 fits)
_NAME_BYTES, _PATH_BYTES = 255, 1024  # a file name's and a path's longest in the manifest (ext4's NAME_MAX)


class ModelFilesError(TandemError):
    """A folder that is not a checkpoint, a manifest that does not validate, a chunk or file
    whose content does not match its hash."""


def is_model_version(v) -> bool:
    """A model version is a folder name a pull may create: letters, digits, '.', '_', '-', at most
    64, starting with a letter or digit, and never '..' (not a path, not a parent)."""
    return isinstance(v, str) and bool(_VERSION.match(v)) and ".." not in v


def check_model_version(v) -> str:
    if not is_model_version(v):
        raise ModelFilesError(f"not a model version name: {v!r:.80} (expected a name such as v0003: letters, "
                              "digits, '.', '_', '-', at most 64)")
    return v


def inside(root: Path, rel: str) -> Path:
    """root / rel, checked to stay inside root once links and '..' are resolved."""
    out = root / rel
    real_root = root.resolve()
    if not out.resolve().is_relative_to(real_root) or out.resolve() == real_root:
        raise ModelFilesError(f"{rel!r:.80} leads outside {root}")
    return out


def _sha256_file(path: Path, chunk_bytes: int) -> tuple[str, list[str]]:
    whole, chunks = hashlib.sha256(), []
    with open(path, "rb") as f:
        while True:
            piece = f.read(chunk_bytes)
            if not piece:
                break
            whole.update(piece)
            chunks.append(hashlib.sha256(piece).hexdigest())
    return whole.hexdigest(), chunks


def model_hash(files: list[dict]) -> str:
    """The whole model's identity: SHA-256 over its sorted (path, size, sha256) list."""
    key = json.dumps(sorted([f["path"], f["size"], f["sha256"]] for f in files), separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()


def model_manifest(model_dir, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """{"files": [{"path", "size", "sha256", "chunks"}], "bytes", "hash", "chunk_bytes"} of a
    checkpoint folder. Hidden files (ours among them) are not part of the model; a link that
    leads out of the folder is refused."""
    root = Path(model_dir)
    if not (root / "config.json").is_file():
        raise ModelFilesError(f"{root} is not a model folder (no config.json)")
    real_root = root.resolve()
    files = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or p.is_dir():
            continue
        if not p.resolve().is_relative_to(real_root):
            raise ModelFilesError(f"{rel} links outside the model folder {root}")
        if not p.is_file():
            continue
        sha, chunks = _sha256_file(p, chunk_bytes)
        files.append({"path": rel.as_posix(), "size": p.stat().st_size, "sha256": sha, "chunks": chunks})
    return {"files": files, "bytes": sum(f["size"] for f in files), "hash": model_hash(files), "chunk_bytes": chunk_bytes}


def chunk_locations(manifest: dict) -> dict[str, tuple[str, int, int]]:
    """chunk hash -> (file path, offset, length): where the server reads a requested chunk."""
    out, step = {}, manifest["chunk_bytes"]
    for f in manifest["files"]:
        for k, h in enumerate(f["chunks"]):
            out.setdefault(h, (f["path"], k * step, min(step, f["size"] - k * step)))
    return out


def _check_path(path, seen: set, folders: set) -> None:
    """A manifest's file path: relative, inside the folder, no hidden or control characters, short
    enough for the file system, and no file where another file needs a folder (`a` and `a/b`)."""
    pp = PurePosixPath(path) if isinstance(path, str) else None
    if (pp is None or not path or pp.is_absolute() or pp.as_posix() != path or "\\" in path or path in seen
            or any(part.startswith(".") for part in pp.parts) or any(_unprintable(c) for c in path)):
        raise ModelFilesError(f"unsafe or repeated file path in the model manifest: {path!r:.80}")
    if len(path.encode()) > _PATH_BYTES or any(
            len(part.encode()) > _NAME_BYTES for part in pp.parts):
        raise ModelFilesError(f"file path too long in the model manifest ({len(path)} characters, at most "
                              f"{_NAME_BYTES} bytes a name and {_PATH_BYTES} in all): {path!r:.80}")
    parents = {p.as_posix() for p in pp.parents if p.as_posix() != "."}
    clash = path if path in folders else next((p for p in parents if p in seen), None)
    if clash is not None:
        raise ModelFilesError(f"the model manifest names {clash!r:.80} both as a file and as a folder")
    seen.add(path)
    folders.update(parents)


def _unprintable(c: str) -> bool:
    """A control character (NUL among them) or a lone surrogate: no file name holds one."""
    return ord(c) < 32 or c == "\x7f" or "\ud800" <= c <= "\udfff"


def check_manifest(manifest, max_bytes: int | None = None) -> dict:
    """The manifest a server sent, validated before anything is written: relative paths inside
    the folder, hashes that are hashes, chunk counts that fit the sizes, each chunk listed once,
    at most `max_bytes` in all, the model hash right."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ModelFilesError("the model manifest must be an object with a list of files")
    step = manifest.get("chunk_bytes")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step <= 64 * 2**20:
        raise ModelFilesError(f"the model manifest's chunk_bytes must be 1..{64 * 2**20}, got {step!r}")
    seen, folders, chunks_seen, total = set(), set(), set(), 0
    for f in manifest["files"]:
        if not isinstance(f, dict):
            raise ModelFilesError(f"a file entry must be an object, got {f!r:.60}")
        path = f.get("path")
        _check_path(path, seen, folders)
        size, sha, chunks = f.get("size"), f.get("sha256"), f.get("chunks")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ModelFilesError(f"{path}: size must be a non-negative integer, got {size!r}")
        if not isinstance(sha, str) or not _HASH.match(sha):
            raise ModelFilesError(f"{path}: sha256 is not a SHA-256 hex digest")
        if (not isinstance(chunks, list) or len(chunks) != -(-size // step)
                or not all(isinstance(h, str) and _HASH.match(h) for h in chunks)):
            raise ModelFilesError(f"{path}: needs {-(-size // step)} chunk hashes for {size} bytes")
        for h in chunks:
            if h in chunks_seen:
                raise ModelFilesError(f"{path}: chunk {h} is listed more than once in the model manifest "
                                      "(each listing would write it again)")
            chunks_seen.add(h)
        total += size
    if max_bytes is not None and total > max_bytes:
        raise ModelFilesError(f"the model is {total / 2**30:.2f} GiB, more than this machine takes "
                              f"({max_bytes / 2**30:.2f} GiB)")
    if manifest.get("bytes") != total:
        raise ModelFilesError(f"the model manifest's bytes ({manifest.get('bytes')!r:.30}) is not the sum of its "
                              f"file sizes ({total})")
    if manifest.get("hash") != model_hash(manifest["files"]):
        raise ModelFilesError("the model manifest's hash does not match its files")
    if "config.json" not in seen:
        raise ModelFilesError("the model manifest has no config.json")
    return manifest


class ModelDownload:
    """Putting one model back together in `dest` from chunks fetched by hash.

        dl = ModelDownload(manifest, dest)       # resumes what an earlier try left in dest.partial
        for h in dl.missing():
            dl.add(h, fetch(h))                  # verified on arrival
        dl.finish(meta)                          # files checked, dest appears atomically

    The manifest is checked before anything is written (a refused one leaves no `.partial`); the
    staging folders are real folders (a link found there is removed, never written through).
    """

    def __init__(self, manifest: dict, dest, max_bytes: int | None = None):
        self.manifest = check_manifest(manifest, max_bytes)
        self.dest = Path(dest)
        self.partial = self.dest.with_name(self.dest.name + ".partial")
        self.chunk_dir = self.partial / "chunks"
        _real_dir(self.partial)
        _real_dir(self.chunk_dir)
        self.sizes = {h: n for h, (_, _, n) in chunk_locations(self.manifest).items()}
        self.resumed = 0
        for p in self.chunk_dir.iterdir():  # what an interrupted try kept, checked again
            ok = (p.name in self.sizes and not p.is_symlink() and p.is_file() and p.stat().st_size == self.sizes[p.name]
                  and _sha256(p.read_bytes()) == p.name)
            if ok:
                self.resumed += 1
            else:
                _remove(p)

    @property
    def total(self) -> int:
        return len(self.sizes)

    def missing(self) -> list[str]:
        return [h for h in self.sizes if not (self.chunk_dir / h).exists()]

    def bytes_done(self) -> int:
        return sum(n for h, n in self.sizes.items() if (self.chunk_dir / h).exists())

    def add(self, digest: str, data: bytes) -> None:
        if digest not in self.sizes:
            raise ModelFilesError(f"chunk {digest} is not part of this model")
        if len(data) != self.sizes[digest] or _sha256(data) != digest:
            raise ModelFilesError(f"chunk {digest} is corrupt: its {len(data)} bytes do not match its hash")
        tmp = self.chunk_dir / (digest + ".tmp")
        _remove(tmp)
        with open(tmp, "xb") as w:  # x: never through a link left there
            w.write(data)
        os.replace(tmp, self.chunk_dir / digest)

    def finish(self, meta: dict | None = None) -> Path:
        """Assemble every file from its chunks, check it, and move the folder into place. A file
        that cannot be written or does not match its hash ends the download: nothing stays."""
        if self.missing():
            raise ModelFilesError(f"{len(self.missing())} of {self.total} chunks are still missing")
        staging = self.partial / "files"
        _remove(staging)
        staging.mkdir()
        try:
            for f in self.manifest["files"]:
                self._assemble(staging, f)
        except (ModelFilesError, OSError, ValueError) as e:
            _remove(self.partial)
            if isinstance(e, ModelFilesError):
                raise
            raise ModelFilesError(f"cannot write the model's files under {self.dest}: {type(e).__name__}: {e}") from None
        record = {"hash": self.manifest["hash"], "bytes": self.manifest["bytes"], **(meta or {})}
        (staging / MANIFEST_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        _remove(self.dest)
        os.replace(staging, self.dest)
        _remove(self.partial)
        return self.dest

    def _assemble(self, staging: Path, f: dict) -> None:
        out = inside(staging, f["path"])
        out.parent.mkdir(parents=True, exist_ok=True)
        whole = hashlib.sha256()
        with open(out, "xb") as w:
            for h in f["chunks"]:
                piece = (self.chunk_dir / h).read_bytes()
                whole.update(piece)
                w.write(piece)
        if whole.hexdigest() != f["sha256"] or out.stat().st_size != f["size"]:
            raise ModelFilesError(f"{f['path']} does not match its hash after assembly")


def _remove(path: Path) -> None:
    """Remove a file, a link (never what it points to) or a folder; nothing there is fine."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _real_dir(path: Path) -> None:
    """path as a folder of its own: a link or a file in its place is removed first."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pulled_record(model_dir) -> dict | None:
    """What `models pull` wrote beside a model's files (version, source, hash), or None."""
    p = Path(model_dir) / MANIFEST_FILE
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_screen(model_dir) -> dict:
    """The sandbox screen a checkpoint of trainer.recipe.default_model was trained on: {"width", "height"} as
    far as its tandem_training.json says ({} when it does not)."""
    try:
        meta = json.loads((Path(model_dir) / "tandem_training.json").read_text(encoding="utf-8"))
        cfg = meta["report"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {k: cfg[k] for k in ("width", "height") if isinstance(cfg.get(k), int)}
