"""The offline stand-ins: the GPT-2 vocabulary for tiktoken, and the TinyStories-format corpus."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import offline  # noqa: E402


def test_tiktoken_gpt2_loads_from_the_cache_without_network(tmp_path):
    cache = offline.write_tiktoken_cache(tmp_path / "tiktoken")
    # A proxy on a closed local port makes any download attempt fail at once.
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    code = ("import tiktoken; e = tiktoken.get_encoding('gpt2'); "
            "assert e.encode('Once upon a time') == [7454, 2402, 257, 640]; print(e.n_vocab)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "50257"


def test_corpus_is_deterministic_and_in_tinystories_format(tmp_path):
    a = offline.write_corpus(tmp_path / "a", n_train=300, n_valid=50)
    b = offline.write_corpus(tmp_path / "b", n_train=300, n_valid=50)
    for name in (offline.TRAIN_FILE, offline.VALID_FILE):
        text = (a / name).read_text()
        assert text == (b / name).read_text(), "same seed, different corpus"
        stories = [s.strip() for s in text.split(offline.EOT)]
        assert stories[-1] == "" and all(stories[:-1]), "stories separated by <|endoftext|> lines"
    train = {s.strip() for s in (a / offline.TRAIN_FILE).read_text().split(offline.EOT)}
    valid = [s.strip() for s in (a / offline.VALID_FILE).read_text().split(offline.EOT) if s.strip()]
    assert len(valid) == 50 and not train.intersection(valid), "a validation story is in the training file"


def test_corpus_is_varied():
    stories = offline.make_stories(4000, seed=0)
    assert len(set(stories)) > 0.95 * len(stories)
    # Every story shape is drawn, none dominates (each has a phrase no other shape uses).
    markers = ["there was a little", "do you want to play", "heard a strange noise", "in the kitchen.",
               "fell asleep", "without asking", "could not wait", "we have to help"]
    shares = [sum(m in s.lower() for s in stories) / len(stories) for m in markers]
    assert all(0.05 < share < 0.25 for share in shares), dict(zip(markers, shares, strict=True))
    # Every entry of every word list occurs as a whole word or phrase.
    text = " ".join(stories)
    lists = {"names": offline.NAMES, "animals": [a for a, _ in offline.ANIMALS], "objects": offline.OBJECTS,
             "places": [p for p, _ in offline.PLACES], "adjectives": offline.ADJ,
             "treats": [food for _, food in offline.TREATS], "openings": offline.OPENINGS}
    for kind, words in lists.items():
        unused = [w for w in words if not re.search(rf"\b{re.escape(w)}\b", text)]
        assert not unused, f"{kind} never used: {unused}"


def test_corpus_is_grammatical():
    stories = offline.make_stories(4000, seed=0)
    text = " ".join(stories)
    assert not re.search(r"\ba [aeiou]", text), "'a' before a vowel: use offline.a()"
    assert not re.search(r"\b(all the|some) (a|an) ", text), "an article after a quantifier"
    # Names, nouns and pronouns agree: "a little girl named Lily ... that she loved".
    agreements = re.findall(r"little (girl|boy) named (\w+)\. \2 had .*? that (she|he) loved", text)
    assert len(agreements) > 100
    for kind, name, pronoun in agreements:
        assert (kind, pronoun) == (("girl", "she") if name in offline.GIRLS else ("boy", "he")), name


def _minigpt_load_stories():
    """`load_stories` exactly as notebook 01 defines it (its cell's text, up to the next helper)."""
    import http.client
    import urllib.request

    source = (Path(__file__).resolve().parent.parent / "md" / "01_minigpt.md").read_text()
    start = source.index("TINYSTORIES_URL = ")
    namespace = {"os": os, "http": http, "urllib": urllib, "Path": Path}
    exec(source[start : source.index("def gpt2_tokenizer()", start)], namespace)  # noqa: S102
    return namespace["load_stories"]


class _Response:
    """What urlopen returns, serving `data` (the test never touches the network)."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def read(self, n: int) -> bytes:
        self.at += n
        return self.data[self.at - n : self.at]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_minigpt_download_stops_after_the_text_the_preset_reads(tmp_path, monkeypatch):
    import urllib.request

    load_stories = _minigpt_load_stories()
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    served = "".join(f"Story {i}: Zoé found a café.\n<|endoftext|>\n" for i in range(900_000)).encode()
    assert len(served) > 2 * (1 << 24), "more than two of the loader's 16 MiB reads"
    fetched = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: fetched.append(url) or _Response(served))

    text, source = load_stories("train", max_chars=20_000_000)
    assert source == "TinyStories" and len(text) == 20_000_000 and len(fetched) == 1
    head = tmp_path / "TinyStories-train-first20000000.txt"
    kept = head.read_bytes()
    assert not (tmp_path / "TinyStories-train.txt").exists(), "a part of the file must not pass for all of it"
    assert len(kept) < len(served) and served.startswith(kept), "the download stopped early, at a story's end"
    assert served[len(kept) :].startswith(b"<|endoftext|>")

    def offline(url, timeout):
        raise OSError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert load_stories("train", max_chars=20_000_000) == (text, "TinyStories"), "read again, not downloaded"
    try:
        load_stories("train")  # the whole split is not there, and there is no network
    except RuntimeError as e:
        assert "no network" in str(e) and "make data" in str(e)
    else:
        raise AssertionError("a failed download must raise a RuntimeError that says what to do")


# --------------------------------------------------------------------------------------
# Every notebook's copy of `load_stories`, on its download path (the network is never used:
# urlopen is replaced by a server of bytes, or fails as it does offline).
# --------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
LOADERS = sorted(p for p in (ROOT / "md").glob("*.md") if "def load_stories(" in p.read_text())


def notebook_load_stories(md: Path):
    """`load_stories` (and TINYSTORIES_URL) exactly as md/NAME.md defines them, and nothing else
    of their cell: the two top-level statements are taken from the cell's syntax tree."""
    import ast
    import http.client
    import urllib.request

    text = md.read_text()
    start = text.rindex("```{code-cell}", 0, text.index("def load_stories("))
    body = text[text.index("\n", start) + 1 : text.index("\n```", start)]
    body = "\n".join(line for line in body.splitlines() if not line.startswith(":tags:"))
    tree = ast.parse(body)
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "load_stories")
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "TINYSTORIES_URL" for t in n.targets))]
    namespace = {"os": os, "http": http, "urllib": urllib, "Path": Path}
    exec(compile(ast.Module(keep, []), str(md), "exec"), namespace)  # noqa: S102
    assert "TINYSTORIES_URL" in namespace, f"{md.name}: load_stories' cell has no TINYSTORIES_URL"
    return namespace["load_stories"]


def test_every_copy_of_load_stories_is_tested():
    assert {p.stem for p in LOADERS} >= {"00_setup", "01_minigpt", "03_tensor_parallel_transformer"}, LOADERS


@pytest.mark.parametrize("md", LOADERS, ids=lambda p: p.stem)
def test_load_stories_downloads_then_reads_the_file(md, tmp_path, monkeypatch):
    import urllib.request

    load_stories = notebook_load_stories(md)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "data"))
    served = "".join(f"Story {i}: Zoé found a café.\n<|endoftext|>\n" for i in range(2000)).encode()
    fetched = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: fetched.append(url) or _Response(served))
    text, source = load_stories("valid")
    assert (text.encode(), source) == (served, "TinyStories"), f"{md.stem}: the download is the text returned"
    assert fetched and fetched[0].endswith("TinyStories-valid.txt"), fetched
    assert (tmp_path / "data" / "TinyStories-valid.txt").read_bytes() == served
    assert not list((tmp_path / "data").glob("*.part")), "the partial file was renamed"
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(OSError("offline")))
    assert load_stories("valid") == (text, "TinyStories"), "the second call reads the file, no download"


@pytest.mark.parametrize("md", LOADERS, ids=lambda p: p.stem)
def test_load_stories_offline_fails_fast_and_says_what_to_do(md, tmp_path, monkeypatch):
    """The real urlopen, under the tests' no-network environment (conftest.py): it must fail at
    once, not after the 60 s timeout, with the clear RuntimeError."""
    import time

    load_stories = notebook_load_stories(md)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "empty"))
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="make data") as info:
        load_stories("valid")
    assert time.perf_counter() - start < 30, "the download attempt waited instead of failing"
    assert isinstance(info.value.__cause__, OSError), info.value.__cause__
    assert not list((tmp_path / "empty").glob("TinyStories-*")), "nothing is left behind"


def test_a_download_fails_at_once_under_the_test_environment():
    """conftest.py's proxies (and, under `make test`, the network namespace) stop any download."""
    code = ("import time, urllib.request\nstart = time.perf_counter()\ntry:\n"
            "    urllib.request.urlopen('https://huggingface.co/', timeout=60)\n"
            "except OSError as e:\n    print(type(e).__name__, round(time.perf_counter() - start, 1))\n"
            "else:\n    print('DOWNLOADED')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kind, seconds = out.stdout.split()
    assert kind == "URLError" and float(seconds) < 10, out.stdout


def test_no_network_runs_a_command_with_loopback_only():
    """`tools/offline.py --no-network -- CMD`: even a raw socket to a public address fails at once
    where the kernel allows a network namespace; loopback works (the kernels need it)."""
    code = ("import os, socket\nprint(os.environ['COURSE_NETWORK'])\n"
            "server = socket.create_server(('127.0.0.1', 0)); socket.create_connection(server.getsockname())\n"
            "try:\n    socket.create_connection(('1.1.1.1', 443), timeout=20)\n"
            "except OSError as e:\n    print('blocked', type(e).__name__)\nelse:\n    print('CONNECTED')\n")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "offline.py"), "--no-network", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("offline: "), lines
    if "proxies only" in lines[1]:
        pytest.skip(f"this kernel allows no network namespace: {lines[1]}")
    assert lines[-1].startswith("blocked"), lines


@pytest.mark.parametrize("environ, message", [
    ({"CPU_DEVICES": "two"}, "CPU_DEVICES='two': give a positive number"),
    ({"CPU_DEVICES": "0"}, "CPU_DEVICES='0': give a positive number"),
    ({"CPU_DEVICES": "-4"}, "CPU_DEVICES='-4': give a positive number"),
    ({"CPU_DEVICES": "2", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
     "CPU_DEVICES=2 but XLA_FLAGS sets --xla_force_host_platform_device_count=8: unset one"),
])
def test_bad_device_counts_are_refused_clearly(environ, message):
    with pytest.raises(ValueError) as info:
        offline.emulated_devices(environ)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("environ, devices", [
    ({}, 8), ({"CPU_DEVICES": "1"}, 1), ({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, 4),
    ({"CPU_DEVICES": "2", "XLA_FLAGS": "--foo --xla_force_host_platform_device_count=2"}, 2),
])
def test_device_counts(environ, devices):
    assert offline.emulated_devices(environ) == devices
    flags = offline.course_env(environ)["XLA_FLAGS"]
    assert re.findall(r"--xla_force_host_platform_device_count=(\d+)", flags) == [str(devices)], flags
