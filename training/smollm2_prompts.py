"""Chat prompts for distilling and evaluating the SmolLM2 draft, built offline.

Three kinds, like resources/prompts/chat.json: questions (`chat`), summaries (`summary`) and code
(`code`). The question topics and code tasks are written here by hand; the summary passages and
the glossary questions come from the Python documentation's reStructuredText sources (Debian's
`python3-doc`, /usr/share/doc/python3.X/html/_sources). The split into training and held-out
prompts is a hash of the prompt's text; the bundled prompts of resources/prompts/chat.json are
always held out (they are what people see in the app).
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SUBJECTS = [
    "photosynthesis",
    " the water cycle",
    " gravity",
    " a black hole",
    " the immune system",
    " inflation in economics",
    "\na volcano",
    " the internet",
    " a vaccine",
    " climate change",
    " the French Revolution",
    " the Roman Empire",
    " democracy",
    "\na rainbow",
    " electricity",
    " magnetism",
    " the moon's phases",
    " an earthquake",
    " evolution",
    " DNA",
    " a cell",
    " the heart",
    "\nsleep",
    " a computer",
    " an operating system",
    " a database",
    " encryption",
    " a password manager",
    " machine learning",
    "\na neural network",
    " a compiler",
    " recursion",
    " a hash table",
    " a linked list",
    " version control",
    " the stock market",
    "\ninterest rates",
    " a budget",
    " a recipe for pancakes",
    " coffee",
    " tea",
    " the Olympic Games",
    " chess",
    " a haiku",
    "\nthe Renaissance",
    " Shakespeare",
    " a symphony",
    " jazz",
    " the solar system",
    " Mars",
    " the ocean tides",
    " a glacier",
    "\na desert",
    " a rainforest",
    " bees",
    " dinosaurs",
    " the printing press",
    " the telephone",
    " a bicycle",
    " an electric car",
    "\nsolar power",
    " wind power",
    " recycling",
    " composting",
    " a library",
    " a museum",
    " a marathon",
    " yoga",
    " meditation",
    "\na healthy breakfast",
    " friendship",
    " a job interview",
    " a resume",
    " public speaking",
    " time management",
]

TIPS = [
    "writing clear emails",
    " learning a new language",
    " staying focused while studying",
    " sleeping better",
    "\nsaving money",
    " cooking rice",
    " starting to run",
    " keeping houseplants alive",
    " travelling on a budget",
    "\ngiving a presentation",
    " learning to program",
    " writing a cover letter",
    " reducing stress",
    " organising a desk",
    "\nmaking friends in a new city",
    " taking better photos",
    " reading more books",
    " drinking more water",
    "\npreparing for an exam",
    " negotiating a salary",
    " working from home",
    " keeping a journal",
    " learning guitar",
    "\npacking for a trip",
    " writing unit tests",
    " naming variables",
    " debugging a program",
    " reviewing code",
]

WHY = [
    "the sky is blue",
    " leaves change colour in autumn",
    " we have seasons",
    " ice floats on water",
    " bread rises",
    "\ncats purr",
    " the sea is salty",
    " we yawn",
    " planes can fly",
    " metal feels cold",
    " onions make us cry",
    "\nstars twinkle",
    " we need sleep",
    " the moon looks bigger near the horizon",
    " soap cleans",
    " people get hiccups",
    "\nthe sun sets in the west",
    " computers use binary",
    " batteries run down",
    " coffee keeps people awake",
]

CODE_TASKS = [
    "returns the largest number in a list",
    " counts the vowels in a string",
    " checks whether a string is a\npalindrome",
    " returns the factorial of a number",
    " computes the n-th Fibonacci number",
    " removes duplicates from\na list while keeping the order",
    " merges two sorted lists",
    " flattens a nested list",
    " reads a text file and\ncounts its lines",
    " converts Celsius to Fahrenheit",
    " checks whether a number is prime",
    " returns the average of\na list of numbers",
    " capitalises every word in a sentence",
    " finds the most common word in a text",
    " sorts a\nlist of dictionaries by a key",
    " returns the sum of the digits of an integer",
    " checks whether two strings are\nanagrams",
    " splits a list into chunks of a given size",
    " returns the second largest number in a list",
    " counts\nhow often each character occurs in a string",
    " converts a list of strings to upper case",
    " returns the\nintersection of two lists",
    " computes the greatest common divisor of two numbers",
    " reverses a string",
    "\nchecks whether a year is a leap year",
    " returns the length of the longest word in a sentence",
    " parses a\ndate string in the format YYYY-MM-DD",
    " writes a list of rows to a CSV file",
    " returns the n smallest\nnumbers of a list",
    " validates an email address with a regular expression",
    " converts a binary string\nto an integer",
    " generates a random password",
    " computes the median of a list",
    " transposes a matrix given\nas a list of lists",
    " counts the words in a file",
    " finds all files with a given extension in a folder",
    "\nreturns a dictionary that maps each word to its length",
    " implements binary search on a sorted list",
    "\nrotates a list by k positions",
    " checks whether brackets in a string are balanced",
]

CODE_FORMS = (
    "Write a Python function that {task}.",
    "Write a short Python function that {task}, with a docstring.",
    "How do I write a Python function that {task}?",
)
CHAT_FORMS = (
    "What is {s}?",
    "Explain {s} in simple terms.",
    "Tell me briefly about {s}.",
    "Describe {s} to a ten-year-old.",
)
SYSTEMS = (None, "You are a concise assistant.", "You are a helpful assistant.")

ROLE = re.compile(r":[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")


def rst_to_text(s: str) -> str:
    s = ROLE.sub(r"\1", s)
    s = s.replace("``", "").replace("**", "").replace("*", "")
    return re.sub(r"\s+", " ", s).strip()


def doc_paragraphs(docs_root: Path | None) -> list[str]:
    """Plain prose paragraphs (not directives, code, tables or headings) of 40-120 words."""
    out = []
    if docs_root is None:  # no python3-doc: no summaries
        return out
    for path in sorted(glob.glob(str(docs_root / "**" / "*.rst.txt"), recursive=True)):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for block in re.split(r"\n\s*\n", text):
            if block[:1].isspace() or block.lstrip().startswith((".. ", "|", "+", "=", "-", "*", ">>>", ":")):
                continue
            plain = rst_to_text(block)
            if 40 <= len(plain.split()) <= 120 and plain.endswith(".") and "::" not in plain:
                out.append(plain)
    return out


def glossary_terms(docs_root: Path | None) -> list[str]:
    path = docs_root / "glossary.rst.txt" if docs_root is not None else None
    if path is None or not path.is_file():
        return []
    return sorted({m.strip() for m in re.findall(r"^   ([a-zA-Z][^\n]{1,40})\n      \S", path.read_text(), re.M)})


def _split(text: str) -> list[str]:
    return [" ".join(t.split()) for t in text.split(";") if t.strip()]


def build_prompts(docs_root: Path | None, n_summaries: int = 400) -> list[dict]:
    """Every candidate prompt, deterministic order; each a dict like chat.json's entries."""
    prompts: list[dict] = []

    def add(kind: str, user: str, i: int) -> None:
        system = SYSTEMS[i % len(SYSTEMS)]
        prompts.append({"kind": kind, "user": user, **({"system": system} if system else {})})

    for i, s in enumerate(_split(";".join(SUBJECTS))):
        for j, form in enumerate(CHAT_FORMS[:2] if i % 2 else CHAT_FORMS[2:]):
            add("chat", form.format(s=s), i + j)
    for i, t in enumerate(_split(";".join(TIPS))):
        add("chat", f"Give me {('three', 'five', 'a few')[i % 3]} tips for {t}.", i)
    for i, w in enumerate(_split(";".join(WHY))):
        add("chat", f"Why {w}?", i)
    for i, term in enumerate(glossary_terms(docs_root)):
        add("chat", f"In Python, what does the term '{term}' mean?", i)
    for i, task in enumerate(_split(";".join(CODE_TASKS))):
        for j, form in enumerate(CODE_FORMS):
            add("code", form.format(task=task), i + j)
    paragraphs = doc_paragraphs(docs_root)
    step = max(1, len(paragraphs) // n_summaries)
    for i, para in enumerate(paragraphs[::step][:n_summaries]):
        lead = ("Summarise in one sentence: ", "Summarise in two sentences: ", "Summarise this paragraph: ")[i % 3]
        add("summary", lead + para, i)
    return prompts


def bundled_prompts() -> list[dict]:
    return json.loads((REPO / "resources" / "prompts" / "chat.json").read_text(encoding="utf-8"))


def is_heldout(prompt: dict, percent: int) -> bool:
    return int(hashlib.sha256(prompt["user"].encode()).hexdigest(), 16) % 100 < percent


def split_prompts(prompts: list[dict], percent: int) -> tuple[list[dict], list[dict]]:
    """(training, held-out): a hash split, plus every bundled prompt in the held-out set."""
    bundled = bundled_prompts()
    seen = {p["user"] for p in bundled}
    train = [p for p in prompts if p["user"] not in seen and not is_heldout(p, percent)]
    held = [p for p in prompts if p["user"] not in seen and is_heldout(p, percent)]
    return train, [{k: v for k, v in p.items() if k != "name"} for p in bundled] + held


def docs_root() -> Path | None:
    found = sorted(glob.glob("/usr/share/doc/python3*/html/_sources"))
    return Path(found[-1]) if found else None
