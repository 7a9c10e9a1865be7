"""The stories the series trains on, and the GPT-2 tokenizer, with clear errors offline."""

import http.client
import os
import urllib.request
from pathlib import Path

import tiktoken

TINYSTORIES_URL = ("https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
                   "TinyStories-{split}.txt")
SEPARATOR = "<|endoftext|>"  # ends each story in the file


def first_stories(chunks, max_stories: int | None) -> str:
    """The text of `chunks` (an iterable of str) up to the end of story `max_stories`; all of it
    when max_stories is None or the text holds fewer. Stops reading once it has them."""
    text, end, found = "", 0, 0
    for chunk in chunks:
        text += chunk
        while max_stories and (i := text.find(SEPARATOR, end)) >= 0:
            end, found = i + len(SEPARATOR), found + 1
            if found == max_stories:
                return text[:end]
    return text


def read_stories(path: Path, max_stories: int | None = None) -> str:
    with open(path, encoding="utf-8") as f:
        return first_stories(iter(lambda: f.read(1 << 24), ""), max_stories)


def load_stories(split: str = "valid", max_stories: int | None = None,
                 timeout_s: float = 60.0) -> tuple[str, str]:
    """(text, source) of a TinyStories split ('train' or 'valid'), its first `max_stories`
    stories when given.

    Looks in $COURSE_DATA_DIR (default ./data) for the real file, then for the course's offline
    corpus (`make data` writes it); otherwise downloads the real file there. With max_stories, a
    download stops once it holds that many and is kept as TinyStories-{split}-first{N}.txt.
    """
    data_dir = Path(os.environ.get("COURSE_DATA_DIR", "data"))
    real, offline = data_dir / f"TinyStories-{split}.txt", data_dir / f"offline-stories-{split}.txt"
    head = data_dir / f"TinyStories-{split}-first{max_stories}.txt"
    if real.exists():
        return read_stories(real, max_stories), "TinyStories"
    if offline.exists():
        return read_stories(offline, max_stories), "offline corpus (TinyStories format)"
    if max_stories and head.exists():
        return read_stories(head), "TinyStories"
    url = TINYSTORIES_URL.format(split=split)
    print(f"Downloading {url}" + (f" (its first {max_stories:,} stories)" if max_stories else "") + " ...")
    target, separator = real, SEPARATOR.encode()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(f"{real}.part", "wb") as f:
            ends = 0
            while chunk := response.read(1 << 24):
                f.write(chunk)
                ends += chunk.count(separator)  # a separator split across chunks is missed: fine
                if max_stories and ends > max_stories:
                    target = head  # stopped early: kept under a name that says so
                    break
        os.replace(f"{real}.part", target)
    except (OSError, http.client.HTTPException) as e:  # no network, or a cut download
        Path(f"{real}.part").unlink(missing_ok=True)
        raise RuntimeError(
            f"Could not download TinyStories-{split}.txt ({e}). With no network, put the file in "
            f"{data_dir}/, or use the course's offline corpus: `make data` in the course repository, "
            "then set COURSE_DATA_DIR to its .cache/data folder.") from e
    return read_stories(target, max_stories), "TinyStories"


def gpt2_tokenizer() -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding (50,257 ids; <|endoftext|> is 50256)."""
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # noqa: BLE001  (tiktoken raises requests' errors when offline)
        raise RuntimeError(
            "tiktoken could not fetch the GPT-2 vocabulary (no network?). In the course "
            "repository, `make data` writes it to .cache/tiktoken: set TIKTOKEN_CACHE_DIR to it.") from e
