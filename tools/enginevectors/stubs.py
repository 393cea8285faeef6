"""Import a handful of modules from an extracted engine wheel, stubbing everything else.

The engines' hashing and event modules sit in packages whose ``__init__`` files pull in
torch, transformers, CUDA kernels and the whole configuration system. None of that takes
part in computing a block hash or encoding an event, so this module installs an import
hook that

* loads the modules named in ``real`` from the extracted sources, unchanged;
* gives every other module of the engine's package (and its package ``__init__`` files)
  an automatic stub: any attribute is a placeholder class that can be subclassed,
  subscripted, called and used as a decorator (a decorator stub returns the decorated
  function unchanged);
* gives any third-party module that is not installed the same kind of stub.

Every stubbed name is recorded in ``STUBBED`` so the generated vectors can list them.
A stub that silently replaced something the hashing path needs would make the engine's
code compute something else: the generator guards against that by re-deriving every
vector with the independent recipes in ``recipes.py`` and failing on any difference.
"""

import importlib.abc
import importlib.util
import os
import sys
import types

STUBBED = set()


class _StubMeta(type):
    """Metaclass of placeholder classes: attribute access, subscription and calls work."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make_stub_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())

    def __call__(cls, *args, **kwargs):
        # Used as a bare decorator: hand the decorated object back unchanged.
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]
        return super().__call__(*args, **kwargs)


class _StubBase(metaclass=_StubMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make_stub_class(name)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _StubBase()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _make_stub_class(qualname):
    return _StubMeta(qualname.rsplit(".", 1)[-1], (_StubBase,), {"__qualname__": qualname})


class StubModule(types.ModuleType):
    """A module whose every missing attribute is a placeholder class."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        # ``from package import submodule`` asks the package first: a submodule that exists
        # in the sources must be imported (really or as a stub, as the finder decides),
        # never shadowed by a placeholder.
        for base in getattr(self, "__path__", None) or []:
            if os.path.exists(os.path.join(base, name + ".py")) or os.path.isdir(
                    os.path.join(base, name)):
                return importlib.import_module(f"{self.__name__}.{name}")
        value = _make_stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = StubModule(spec.name)
        return module

    def exec_module(self, module):
        STUBBED.add(module.__name__)


class EngineFinder(importlib.abc.MetaPathFinder):
    """Serves one engine package from ``src_root``: real modules as listed, stubs otherwise."""

    def __init__(self, package, src_root, real, provided=None, force_stub=()):
        self.package = package
        self.src_root = src_root
        self.real = set(real)
        self.provided = provided or {}
        self.force_stub = set(force_stub)

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if fullname in self.provided:
            return importlib.util.spec_from_loader(fullname, _ProvidedLoader(self.provided[fullname]))
        if top in self.force_stub:
            return importlib.util.spec_from_loader(fullname, _StubLoader(), is_package=True)
        if top != self.package:
            return None
        rel = fullname.replace(".", os.sep)
        pkg_dir = os.path.join(self.src_root, rel)
        mod_file = os.path.join(self.src_root, rel + ".py")
        if fullname in self.real:
            if os.path.isdir(pkg_dir):
                init = os.path.join(pkg_dir, "__init__.py")
                return importlib.util.spec_from_file_location(
                    fullname, init, submodule_search_locations=[pkg_dir])
            if not os.path.exists(mod_file):
                raise ImportError(f"{fullname}: no {mod_file} in this release")
            return importlib.util.spec_from_file_location(fullname, mod_file)
        spec = importlib.util.spec_from_loader(fullname, _StubLoader(), is_package=True)
        if os.path.isdir(pkg_dir):
            spec.submodule_search_locations = [pkg_dir]
        return spec


class _ProvidedLoader(importlib.abc.Loader):
    def __init__(self, factory):
        self.factory = factory

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.factory(module)


class MissingFinder(importlib.abc.MetaPathFinder):
    """Last resort: a stub for the named third-party packages when they are not installed.

    Only the listed top-level names are stubbed: an unlisted missing import still fails,
    so a library's own optional imports (``try: import x``) keep their real behaviour.
    """

    def __init__(self, tops):
        self.tops = set(tops)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.tops:
            return None
        return importlib.util.spec_from_loader(fullname, _StubLoader(), is_package=True)


# Third-party packages the engines import at module level on paths that never touch
# hashing or event encoding.
HEAVY_THIRD_PARTY = (
    "torch", "triton", "transformers", "pydantic", "pydantic_core", "regex", "cachetools",
    "psutil", "pybase64", "requests", "aiohttp", "fastapi", "uvicorn", "orjson", "setproctitle",
    "sentencepiece", "tokenizers", "huggingface_hub", "safetensors", "einops", "PIL", "blake3",
    "openai", "prometheus_client", "tqdm", "filelock", "jinja2", "partial_json_parser",
    "pybind11_abseil", "sgl_kernel", "flashinfer", "vllm_flash_attn", "outlines", "xgrammar",
    "llguidance", "lark", "interegular", "decord", "soundfile", "uvloop", "dill", "ray",
    "cloudpickle", "gguf", "mistral_common", "compressed_tensors", "depyf", "watchfiles",
    "python_multipart", "prometheus_fastapi_instrumentator", "pyarrow", "pandas", "scipy",
    "yaml", "packaging", "zmq_async", "grpc", "google", "opentelemetry", "ninja", "cuda",
    "nvtx", "pynvml", "amdsmi", "datasets", "modelscope", "IPython", "msgpack", "pillow",
    "xxhash_cffi", "setuptools", "anthropic", "starlette", "httpx", "numba", "cv2",
)


def install(package, src_root, real, provided=None, force_stub=(), stub_missing=HEAVY_THIRD_PARTY):
    """Install the hooks for ``package`` served from ``src_root``."""
    sys.meta_path.insert(0, EngineFinder(package, src_root, real, provided, force_stub))
    sys.meta_path.append(MissingFinder(stub_missing))


def logger_module(module):
    """A ``*.logger`` replacement: ``init_logger`` returns a std logger with *_once methods."""
    import logging

    def init_logger(name):
        log = logging.getLogger(name)
        for level in ("debug", "info", "warning", "error"):
            if not hasattr(log, level + "_once"):
                setattr(log, level + "_once", getattr(log, level))
        return log

    module.init_logger = init_logger
    module.logger = init_logger("engine")
