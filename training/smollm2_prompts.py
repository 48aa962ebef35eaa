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

SUBJECTS = """photosynthesis; the water cycle; gravity; a black hole; the immune system; inflation in economics;
a volcano; the internet; a vaccine; climate change; the French Revolution; the Roman Empire; democracy;
a rainbow; electricity; magnetism; the moon's phases; an earthquake; evolution; DNA; a cell; the heart;
sleep; a computer; an operating system; a database; encryption; a password manager; machine learning;
a neural network; a compiler; recursion; a hash table; a linked list; version control; the stock market;
interest rates; a budget; a recipe for pancakes; coffee; tea; the Olympic Games; chess; a haiku;
the Renaissance; Shakespeare; a symphony; jazz; the solar system; Mars; the ocean tides; a glacier;
a desert; a rainforest; bees; dinosaurs; the printing press; the telephone; a bicycle; an electric car;
solar power; wind power; recycling; composting; a library; a museum; a marathon; yoga; meditation;
a healthy breakfast; friendship; a job interview; a resume; public speaking; time management""".split(";")

TIPS = """writing clear emails; learning a new language; staying focused while studying; sleeping better;
saving money; cooking rice; starting to run; keeping houseplants alive; travelling on a budget;
giving a presentation; learning to program; writing a cover letter; reducing stress; organising a desk;
making friends in a new city; taking better photos; reading more books; drinking more water;
preparing for an exam; negotiating a salary; working from home; keeping a journal; learning guitar;
packing for a trip; writing unit tests; naming variables; debugging a program; reviewing code""".split(";")

WHY = """the sky is blue; leaves change colour in autumn; we have seasons; ice floats on water; bread rises;
cats purr; the sea is salty; we yawn; planes can fly; metal feels cold; onions make us cry;
stars twinkle; we need sleep; the moon looks bigger near the horizon; soap cleans; people get hiccups;
the sun sets in the west; computers use binary; batteries run down; coffee keeps people awake""".split(";")

CODE_TASKS = """returns the largest number in a list; counts the vowels in a string; checks whether a string is a
palindrome; returns the factorial of a number; computes the n-th Fibonacci number; removes duplicates from
a list while keeping the order; merges two sorted lists; flattens a nested list; reads a text file and
counts its lines; converts Celsius to Fahrenheit; checks whether a number is prime; returns the average of
a list of numbers; capitalises every word in a sentence; finds the most common word in a text; sorts a
list of dictionaries by a key; returns the sum of the digits of an integer; checks whether two strings are
anagrams; splits a list into chunks of a given size; returns the second largest number in a list; counts
how often each character occurs in a string; converts a list of strings to upper case; returns the
intersection of two lists; computes the greatest common divisor of two numbers; reverses a string;
checks whether a year is a leap year; returns the length of the longest word in a sentence; parses a
date string in the format YYYY-MM-DD; writes a list of rows to a CSV file; returns the n smallest
numbers of a list; validates an email address with a regular expression; converts a binary string
to an integer; generates a random password; computes the median of a list; transposes a matrix given
as a list of lists; counts the words in a file; finds all files with a given extension in a folder;
returns a dictionary that maps each word to its length; implements binary search on a sorted list;
rotates a list by k positions; checks whether brackets in a string are balanced""".split(";")

CODE_FORMS = ("Write a Python function that {task}.", "Write a short Python function that {task}, with a docstring.",
              "How do I write a Python function that {task}?")
CHAT_FORMS = ("What is {s}?", "Explain {s} in simple terms.", "Tell me briefly about {s}.",
              "Describe {s} to a ten-year-old.")
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
