"""Generate testdata/engines/*.json from the published vLLM and SGLang wheels.

    python3 tools/enginevectors/generate.py [--cache DIR] [--out DIR] [--only NAME...]

Run by ``make vectors`` (needs network access to PyPI, g++ and OpenSSL headers; not
part of ``make test``). For each release: download the wheel, keep its sources in the
cache, run the release's own hashing / event code in worker processes (one per
environment: PYTHONHASHSEED set, "random" or unset, int or bytes event hashes), check
every result against the independent recipes in recipes.py, and write one JSON file.
"""

import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import fetch  # noqa: E402
import recipes  # noqa: E402

VLLM_RELEASES = ["0.23.0", "0.24.0", "0.28.0", "0.29.0", "0.31.0", "0.33.0", "0.34.0"]
SGLANG_RELEASES = ["0.5.19", "0.5.20", "0.5.22", "0.5.23"]

ALGORITHMS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
LORA = {"name": "adapter-a", "path": "/adapters/adapter-a", "int_id": 1}
SALT = "salt-1"
# Two images; with block size 4 both lie in block 1 ([4, 8)), so the tagged form has two
# ("mm", ...) tuples in one block (pickle then writes the second "mm" as a memo reference).
MM = [["img-a", 2, 3], ["img-b", 5, 6]]
VARIANTS = {
    "plain": {},
    "salt": {"cache_salt": SALT},
    "lora": {"lora": LORA},
    "lora+salt": {"lora": LORA, "cache_salt": SALT},
}


def version_tuple(v):
    return tuple(int(x) for x in v.split("."))


# ------------------------------------------------------------------------------- vLLM

def vllm_facts(version):
    """What FINDINGS.md says about a vLLM release; recipes.py checks the engine against it."""
    v = version_tuple(version)
    return {
        "event_form": "array" if v < (0, 24) else "map",
        "fixed_default_seed": v >= (0, 29),
        "tagged_extra_keys": v >= (0, 31),
        "lookahead_hashing": v >= (0, 33),
        "replay_frames_carry_topic": v >= (0, 26),
    }


def vllm_hash_task(algorithm, bs, variant, seed_label, lookahead=0, extra=None):
    task = {"kind": "hash", "algorithm": algorithm, "block_size": bs, "lookahead": lookahead}
    task.update(VARIANTS.get(variant, {}))
    task.update(extra or {})
    task["id"] = f"{algorithm}/bs{bs}/{variant}/seed={seed_label}/L{lookahead}"
    task["variant"] = variant
    return task


def vllm_jobs(version):
    """(environment label, env overrides, tasks) for one release."""
    facts = vllm_facts(version)
    main = [{"id": "struct_fields", "kind": "struct_fields"}]
    main += [{"id": f"none_hash/{a}", "kind": "none_hash", "algorithm": a} for a in ALGORITHMS]
    for a in ALGORITHMS:
        for bs in (16, 4):
            for variant in VARIANTS:
                main.append(vllm_hash_task(a, bs, variant, "0"))
    for a in ("sha256", "sha256_cbor"):
        main.append(vllm_hash_task(a, 4, "mm", "0", extra={"mm": MM}))
        main.append(vllm_hash_task(a, 4, "mm+lora+salt", "0",
                                   extra={"mm": MM, "lora": LORA, "cache_salt": SALT}))
    if facts["lookahead_hashing"]:
        for lookahead in (1, 3):
            for bs in (16, 4):
                for variant in ("plain", "salt", "lora+salt"):
                    main.append(vllm_hash_task("sha256", bs, variant, "0", lookahead))
            main.append(vllm_hash_task("sha256_cbor", 16, "plain", "0", lookahead))
            main.append(vllm_hash_task("xxhash", 4, "plain", "0", lookahead))
            main.append(vllm_hash_task("sha256", 4, "mm", "0", lookahead, {"mm": MM}))
    plain_and_lora = [{"label": "plain"}, {"label": "lora+salt", "lora": LORA, "cache_salt": SALT}]
    main.append({"id": "events/sha256/bs16", "kind": "events", "algorithm": "sha256",
                 "block_size": 16, "requests": plain_and_lora})
    if facts["lookahead_hashing"]:
        main.append({"id": "events/sha256/bs4/L1", "kind": "events", "algorithm": "sha256",
                     "block_size": 4, "lookahead": 1, "topic": "kv@engine-0",
                     "requests": plain_and_lora})
    main.append({"id": "media/sha256/bs16", "kind": "media", "algorithm": "sha256",
                 "block_size": 16})
    jobs = [("seed=0", {"PYTHONHASHSEED": "0"}, main)]
    jobs.append(("seed=0,bytes", {"PYTHONHASHSEED": "0", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"},
                 [{"id": "events/sha256/bs16/bytes", "kind": "events", "algorithm": "sha256",
                   "block_size": 16, "requests": [{"label": "plain"}]}]))
    for label, env in (("42", {"PYTHONHASHSEED": "42"}), ("random", {"PYTHONHASHSEED": "random"}),
                       ("unset#1", {"PYTHONHASHSEED": None}), ("unset#2", {"PYTHONHASHSEED": None})):
        tasks = [{"id": f"none_hash/{a}", "kind": "none_hash", "algorithm": a} for a in ALGORITHMS]
        for a in ALGORITHMS:
            tasks.append(vllm_hash_task(a, 16, "plain", label.split("#")[0]))
        jobs.append((f"seed={label}", env, tasks))
    return jobs


# ----------------------------------------------------------------------------- SGLang

def sglang_facts(version):
    v = version_tuple(version)
    return {
        "event_form": "array" if v < (0, 5, 20) else "map",
        "namespaced_tree_chain": v >= (0, 5, 20),
        "event_chain_ignores_extra_key": True,
        "dynamo_format": v >= (0, 5, 22),
        "default_format_namespaces_registered_lora": v >= (0, 5, 23),
        "lora_name_field": v >= (0, 5, 22),
    }


SG_LORA = {"name": "adapter-a", "path": "/adapters/adapter-a"}
# An adapter loaded at run time (/load_lora_adapter): SGLang mints lora_id = uuid4().hex.
SG_RUNTIME_LORA = {"name": "adapter-b", "path": "/adapters/adapter-b",
                   "lora_id": "5f0e7c1a9b2d4e6f8a0b1c2d3e4f5a6b"}


def sglang_jobs(version):
    facts = sglang_facts(version)
    tasks = [{"id": "struct_fields", "kind": "struct_fields"},
             {"id": "lora_id", "kind": "lora_id", **SG_LORA}]
    variants = {
        "plain": {},
        "salt": {"cache_salt": SALT},
        "lora": {"lora": SG_LORA},
        "lora-runtime": {"lora": SG_RUNTIME_LORA},
        "lora+salt": {"lora": SG_LORA, "cache_salt": SALT},
        "bigram": {"bigram": True},
        "bigram+salt": {"bigram": True, "cache_salt": SALT},
    }
    formats = ["default"] + (["dynamo"] if facts["dynamo_format"] else [])
    for fmt in formats:
        for ps in (16, 4):
            for name, spec in variants.items():
                if fmt == "dynamo" and name.startswith("bigram"):
                    continue
                tasks.append({"id": f"pages/{fmt}/ps{ps}/{name}", "kind": "pages", "page_size": ps,
                              "dynamo_format": fmt == "dynamo", "variant": name, **spec})
        if facts["default_format_namespaces_registered_lora"] and fmt == "default":
            tasks.append({"id": "pages/default/ps16/lora-unregistered", "kind": "pages",
                          "page_size": 16, "variant": "lora-unregistered", "lora": SG_LORA,
                          "registered": False})
    tasks.append({"id": "pages/default/ps1/plain", "kind": "pages", "page_size": 1,
                  "variant": "plain", "tokens": common.PROMPT[:8]})
    tasks.append({"id": "events/default/ps16/plain+media", "kind": "events", "page_size": 16,
                  "variant": "plain", "media": ["CPU", "DISK"]})
    tasks.append({"id": "events/default/ps4/salt", "kind": "events", "page_size": 4,
                  "variant": "salt", "cache_salt": SALT, "topic": "kv@engine-0"})
    tasks.append({"id": "events/default/ps4/bigram", "kind": "events", "page_size": 4,
                  "variant": "bigram", "bigram": True, "tokens": common.PROMPT[:13]})
    tasks.append({"id": "events/default/ps16/lora", "kind": "events", "page_size": 16,
                  "variant": "lora", "lora": SG_LORA})
    if facts["dynamo_format"]:
        tasks.append({"id": "events/dynamo/ps16/lora+salt", "kind": "events", "page_size": 16,
                      "variant": "lora+salt", "lora": SG_LORA, "cache_salt": SALT,
                      "dynamo_format": True})
    return [("default", {}, tasks)]


# ------------------------------------------------------------------------------ run

def run_worker(worker, job, env_overrides, python):
    env = dict(os.environ)
    for k, v in env_overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    proc = subprocess.run([python, os.path.join(HERE, worker)], input=json.dumps(job),
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise RuntimeError(f"{worker} failed (rc={proc.returncode})")
    return json.loads(proc.stdout)


def tool_versions(python):
    out = subprocess.run([python, "-c", (
        "import sys, importlib.metadata as m; print(sys.version.split()[0]); "
        "[print(p, m.version(p)) for p in ('msgspec','cbor2','xxhash','pyzmq','numpy','pybind11')]")],
        capture_output=True, text=True, check=True).stdout.split("\n")
    versions = {"python": out[0]}
    for line in out[1:]:
        if line:
            k, v = line.split()
            versions[k] = v
    gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    versions["g++"] = gxx
    versions["platform"] = platform.machine()
    return versions


def wheel_info(src):
    with open(os.path.join(src, "WHEEL.json")) as f:
        return json.load(f)


def generate_vllm(version, cache, python):
    src = fetch.fetch(cache, "vllm", version)
    facts = vllm_facts(version)
    out = {"engine": "vllm", "version": version, "wheel": wheel_info(src), "facts": facts,
           "prompt_token_ids": common.PROMPT, "none_hashes": [], "hash_cases": [],
           "event_cases": [], "stubbed_modules": None}
    none_hash_by_env = {}
    for label, env, tasks in vllm_jobs(version):
        res = run_worker("vllm_worker.py", {"src": os.path.abspath(src), "tasks": tasks}, env, python)
        out["stubbed_modules"] = sorted(set(out["stubbed_modules"] or []) | set(res.pop("__stubbed__")))
        seed = env.get("PYTHONHASHSEED")
        for task in tasks:
            r = res[task["id"]]
            if task["kind"] == "struct_fields":
                out["structs"] = r
            elif task["kind"] == "none_hash":
                none_hash_by_env[(label, task["algorithm"])] = r
            elif task["kind"] == "hash":
                out["hash_cases"].append(vllm_hash_case(facts, task, r, seed, label))
            else:
                out["event_cases"].append(vllm_event_case(facts, task, r, env, out))
    for a in ALGORITHMS:
        for label in ("0", "42", "random", "unset"):
            key = (f"seed={label}#1" if label == "unset" else f"seed={label}", a)
            r = none_hash_by_env[key]
            entry = {"algorithm": a, "python_hash_seed": None if label == "unset" else label,
                     "seed_text": r["seed_text"], "preimage_hex": r["preimage_hex"],
                     "none_hash_hex": r["none_hash_hex"]}
            if label == "unset":
                second = none_hash_by_env[("seed=unset#2", a)]["none_hash_hex"]
                entry["reproducible"] = second == r["none_hash_hex"]
                entry["second_run_none_hash_hex"] = second
                expected = recipes.vllm_none_hash_seed(facts, a, None)
                assert entry["reproducible"] == (expected is not None), (version, a, entry)
                if expected is None:
                    # Random per process (two runs differed): no value worth keeping, and
                    # keeping one would change the file on every regeneration.
                    entry["seed_text"] = entry["preimage_hex"] = None
                    entry["none_hash_hex"] = entry["second_run_none_hash_hex"] = None
            else:
                entry["reproducible"] = True
            if entry["reproducible"]:
                seed_text = recipes.vllm_none_hash_seed(facts, a, entry["python_hash_seed"])
                pre = recipes.vllm_serialize(seed_text, a)
                assert pre.hex() == r["preimage_hex"], (version, a, label)
                assert recipes.vllm_digest(pre, a).hex() == r["none_hash_hex"], (version, a, label)
                entry["seed_text"] = seed_text
            out["none_hashes"].append(entry)
    # Hash cases under a random NONE_HASH are not reproducible: left out.
    out["hash_cases"] = [c for c in out["hash_cases"] if c is not None and c["reproducible"]]
    return out


def vllm_hash_case(facts, task, r, seed, label):
    """One hash case; ``seed`` is the PYTHONHASHSEED value (None: unset)."""
    if label == "seed=unset#2":
        return None  # the second unset run only serves the reproducibility check
    case = {
        "id": task["id"],
        "algorithm": task["algorithm"],
        "python_hash_seed": seed,
        "block_size": task["block_size"],
        "lookahead_tokens": task.get("lookahead", 0),
        "lora": task.get("lora"),
        "cache_salt": task.get("cache_salt"),
        "mm": task.get("mm"),
        "reproducible": recipes.vllm_none_hash_seed(facts, task["algorithm"], seed) is not None,
        "none_hash_hex": r["none_hash_hex"],
        "blocks": r["blocks"],
    }
    # Cross-check against the documented recipe.
    expected = recipes.vllm_blocks(facts, case, common.PROMPT, bytes.fromhex(r["none_hash_hex"]))
    assert len(expected) == len(case["blocks"]), (case["id"], len(expected), len(case["blocks"]))
    for exp, got in zip(expected, case["blocks"]):
        assert exp["preimage"].hex() == got["preimage_hex"], (case["id"], got["index"])
        assert exp["hash"].hex() == got["hash_hex"], (case["id"], got["index"])
        assert common.to_json(exp["extra_keys"]) == got["extra_keys"], (case["id"], got["index"])
        assert recipes.vllm_event_hash(exp["hash"]) == got["event_hash"], (case["id"], got["index"])
        window = exp["extra_keys"][0] if case["lookahead_tokens"] else exp["extra_keys"]
        assert common.to_json(recipes.vllm_untag(window)) == got["event_extra_keys"], case["id"]
    case["unhashed_tail_tokens"] = len(common.PROMPT) - len(case["blocks"]) * case["block_size"]
    return case


def event_as_dict(event, structs):
    """Positional (array) or map event -> dict keyed by field name."""
    if isinstance(event, dict):
        return event
    tag, values = event[0], event[1:]
    return {"type": tag, **dict(zip(structs[tag]["fields"], values))}


def vllm_event_case(facts, task, r, env, out):
    structs = out["structs"]
    case = {"id": task["id"], "kind": task["kind"], "algorithm": task["algorithm"],
            "block_size": task["block_size"], "lookahead_tokens": task.get("lookahead", 0),
            "env": {k: v for k, v in env.items() if v is not None},
            "topic": task.get("topic", ""), "requests": task.get("requests")}
    case.update(r)
    int_hashes = env.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"
    # Check every BlockStored that carries tokens against the recipe.
    reqs = iter(task.get("requests") or [])
    for batch in r["decoded"]:
        assert isinstance(batch, list) and len(batch) == 3, batch
        for ev in batch[1]:
            expected_form = facts["event_form"]
            assert isinstance(ev, list if expected_form == "array" else dict), (task["id"], ev)
            d = event_as_dict(ev, structs)
            if d["type"] != "BlockStored" or not d["token_ids"]:
                continue
            spec = next(reqs)
            sub = {"algorithm": task["algorithm"], "block_size": task["block_size"],
                   "lookahead_tokens": task.get("lookahead", 0), "lora": spec.get("lora"),
                   "cache_salt": spec.get("cache_salt")}
            none_hash = recipes.vllm_digest(recipes.vllm_serialize("0", task["algorithm"]),
                                            task["algorithm"])
            blocks = recipes.vllm_blocks(facts, sub, common.PROMPT, none_hash)
            want = [recipes.vllm_event_hash(b["hash"]) if int_hashes else {"bytes_hex": b["hash"].hex()}
                    for b in blocks]
            assert d["block_hashes"] == want, (task["id"], d["block_hashes"], want)
            want_keys = [common.to_json(recipes.vllm_untag(
                b["extra_keys"][0] if sub["lookahead_tokens"] else b["extra_keys"])) for b in blocks]
            assert d.get("extra_keys") == want_keys, (task["id"], d.get("extra_keys"), want_keys)
            if sub["lookahead_tokens"]:
                assert d["lookahead_token_ids"] == [list(b["extra_keys"][1:]) for b in blocks]
    return case


def generate_sglang(version, cache, python):
    src = fetch.fetch(cache, "sglang", version)
    facts = sglang_facts(version)
    out = {"engine": "sglang", "version": version, "wheel": wheel_info(src), "facts": facts,
           "prompt_token_ids": common.PROMPT, "page_cases": [], "event_cases": []}
    build = os.path.abspath(os.path.join(cache, "build", f"sglang-{version}"))
    for label, env, tasks in sglang_jobs(version):
        res = run_worker("sglang_worker.py", {"src": os.path.abspath(src), "build_dir": build,
                                              "tasks": tasks}, env, python)
        out["stubbed_modules"] = sorted(set(out.get("stubbed_modules") or []) | set(res.pop("__stubbed__")))
        for task in tasks:
            r = res[task["id"]]
            if task["kind"] == "struct_fields":
                out["structs"] = r
            elif task["kind"] == "lora_id":
                out["lora_deterministic_id"] = {"name": task["name"], "path": task["path"],
                                                "lora_id": r["deterministic_id"]}
            else:
                case = {"id": task["id"], "kind": task["kind"], "page_size": task["page_size"],
                        "format": "dynamo" if task.get("dynamo_format") else "default",
                        "bigram": task.get("bigram", False), "cache_salt": task.get("cache_salt"),
                        "lora_registered": task.get("registered", True) if task.get("lora") else None,
                        "media": task.get("media"), "topic": task.get("topic", "")}
                case.update(r)
                expected = recipes.sglang_pages(facts, {**task, "lora": r["lora"]}, r["pages"])
                for page, (t, e, i) in zip(r["pages"], expected):
                    assert page["tree_hash_hex"] == t, (version, task["id"])
                    assert page["event_chain_hash_hex"] == e, (version, task["id"])
                    assert page["event_i64"] == i, (version, task["id"], page["event_i64"], i)
                if task["kind"] == "events":
                    for batch in r["decoded"]:
                        for ev in batch[1]:
                            want = list if facts["event_form"] == "array" else dict
                            assert isinstance(ev, want), (version, task["id"], ev)
                out["page_cases" if task["kind"] == "pages" else "event_cases"].append(case)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=".cache/enginevectors")
    ap.add_argument("--out", default="testdata/engines")
    ap.add_argument("--only", nargs="*", help="e.g. vllm-0.31.0 sglang-0.5.23")
    args = ap.parse_args()
    python = os.path.join(args.cache, "venv", "bin", "python")
    versions = tool_versions(python)
    os.makedirs(args.out, exist_ok=True)
    targets = [("vllm", v) for v in VLLM_RELEASES] + [("sglang", v) for v in SGLANG_RELEASES]
    for engine, version in targets:
        name = f"{engine}-{version}"
        if args.only and name not in args.only:
            continue
        print(f"generating {name}", flush=True)
        gen = generate_vllm if engine == "vllm" else generate_sglang
        data = gen(version, args.cache, python)
        data["generator"] = {"command": "make vectors", "tools": versions}
        path = os.path.join(args.out, f"{name}.json")
        with open(path, "w") as f:
            json.dump(data, f, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {path} ({os.path.getsize(path)} bytes)", flush=True)


if __name__ == "__main__":
    main()
