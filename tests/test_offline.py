"""The offline stand-ins: the GPT-2 vocabulary for tiktoken, and the TinyStories-format corpus."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
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


# `load_stories` itself is tested once, from its source, in tests/test_course.py: the notebooks'
# copies of course/data.py are checked to equal it.


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
