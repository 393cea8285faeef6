"""Download the published vLLM / SGLang wheels and keep only their Python sources.

Each release is fetched with ``pip download --no-deps`` into a temporary directory; the
wheel's source files (``*.py``, and the C++ files SGLang compiles at run time) are extracted into ``<cache>/src/<engine>-<version>/`` and the wheel
is deleted (vLLM wheels are ~300 MB each). A ``WHEEL.json`` next to the sources records the
wheel's file name, size and SHA-256 so the generated vectors can name exactly what they ran.
Nothing here is ever committed: the cache directory is ignored by git.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


# Python sources, plus the C++ sources SGLang compiles at run time (its page hash).
SOURCE_SUFFIXES = (".py", ".cpp", ".cc", ".h", ".hpp")


def release_dir(cache, engine, version):
    """Directory holding the extracted sources of one engine release."""
    return os.path.join(cache, "src", f"{engine}-{version}")


def fetch(cache, engine, version):
    """Ensure the sources of ``engine==version`` are extracted; return their directory."""
    dest = release_dir(cache, engine, version)
    marker = os.path.join(dest, "WHEEL.json")
    if os.path.exists(marker):
        return dest
    os.makedirs(os.path.join(cache, "src"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"dl-{engine}-{version}-", dir=cache)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", tmp, f"{engine}=={version}"],
            check=True,
        )
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if len(wheels) != 1:
            raise RuntimeError(f"expected one wheel for {engine}=={version}, got {wheels}")
        wheel = os.path.join(tmp, wheels[0])
        digest = hashlib.sha256()
        with open(wheel, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        staging = dest + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.endswith(SOURCE_SUFFIXES):
                    zf.extract(name, staging)
        with open(os.path.join(staging, "WHEEL.json"), "w") as f:
            json.dump({"wheel": wheels[0], "size": os.path.getsize(wheel),
                       "sha256": digest.hexdigest()}, f, indent=1)
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(staging, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


if __name__ == "__main__":
    cache = sys.argv[1]
    for spec in sys.argv[2:]:
        engine, version = spec.split("==")
        print(fetch(cache, engine, version))
