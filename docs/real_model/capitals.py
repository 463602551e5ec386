"""The real-model example's task (docs/real_model.md): name a country's capital, in a few words.

Owns the table of countries and capitals, the train / held-out split, the prompt, the two JSONL
files made from them (`python docs/real_model/capitals.py` writes them; a test checks that the
files in the repository are what it writes) and the reward. Pure: no torch, no I/O but `main`.

Prompt (a user message; the producer renders it with the model's chat template,
`task.prompt_format = "chat"`): "What is the capital of {country}? Answer with just the city
name."

Split: the table in its order, every 4th country (index % 4 == 3) held out: the held-out
countries never appear in training prompts.

Reward (`capital`, "capitals:capital" in the config): 1.0 when the completion names the
right capital and no other capital of the table, else 0.0. Names are compared after
normalisation (`normalise`: accents removed, lower case, every run of characters other than
letters and digits one space), as whole words ("Rome" is not found in "Romero"). An answer
may list aliases separated by "|" ("Kyiv|Kiev"), any of which counts. Naming a second capital
scores 0, so listing cities ("Paris, Berlin, Rome") is never rewarded. The completion the
reward sees is cut at the first stop token and has special tokens removed
(producer/tokenizer.py); at `sampling.max_new_tokens` tokens a long sentence is cut before it
names the city, which is what makes the model learn to answer briefly.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from pathlib import Path

PROMPT = "What is the capital of {country}? Answer with just the city name."

# (country, capital[|alias...]): well-known sovereign states with one agreed capital.
CAPITALS: tuple[tuple[str, str], ...] = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing|Peking"),
    ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"), ("Austria", "Vienna"),
    ("Ireland", "Dublin"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Poland", "Warsaw"),
    ("Hungary", "Budapest"), ("Czech Republic", "Prague"), ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"), ("United Kingdom", "London"), ("Canada", "Ottawa"),
    ("Mexico", "Mexico City"), ("Argentina", "Buenos Aires"), ("Peru", "Lima"),
    ("Chile", "Santiago"), ("Colombia", "Bogota"), ("Venezuela", "Caracas"), ("Cuba", "Havana"),
    ("India", "New Delhi"), ("Pakistan", "Islamabad"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("South Korea", "Seoul"), ("Indonesia", "Jakarta"),
    ("Philippines", "Manila"), ("Malaysia", "Kuala Lumpur"), ("Iran", "Tehran"),
    ("Iraq", "Baghdad"), ("Turkey", "Ankara"), ("Saudi Arabia", "Riyadh"), ("Kenya", "Nairobi"),
    ("Ethiopia", "Addis Ababa"), ("Nigeria", "Abuja"), ("Ghana", "Accra"), ("Morocco", "Rabat"),
    ("Algeria", "Algiers"), ("Tunisia", "Tunis"), ("Australia", "Canberra"),
    ("New Zealand", "Wellington"), ("Ukraine", "Kyiv|Kiev"), ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"), ("Croatia", "Zagreb"), ("Switzerland", "Bern"),
    ("Iceland", "Reykjavik"), ("Afghanistan", "Kabul"), ("Bangladesh", "Dhaka"),
    ("Nepal", "Kathmandu"), ("Syria", "Damascus"), ("Lebanon", "Beirut"), ("Jordan", "Amman"),
    ("Qatar", "Doha"), ("Senegal", "Dakar"), ("Uganda", "Kampala"), ("Zimbabwe", "Harare"),
    ("Ecuador", "Quito"), ("Uruguay", "Montevideo"), ("Paraguay", "Asuncion"),
    ("Jamaica", "Kingston"), ("Estonia", "Tallinn"), ("Latvia", "Riga"),
    ("Lithuania", "Vilnius"), ("Slovakia", "Bratislava"), ("Slovenia", "Ljubljana"),
    ("United States", "Washington"), ("Brazil", "Brasilia"), ("North Korea", "Pyongyang"),
    ("Mongolia", "Ulaanbaatar|Ulan Bator"), ("Kazakhstan", "Astana"),
    ("Uzbekistan", "Tashkent"), ("Georgia", "Tbilisi"), ("Armenia", "Yerevan"),
    ("Azerbaijan", "Baku"), ("Belarus", "Minsk"), ("Moldova", "Chisinau"),
    ("Albania", "Tirana"), ("North Macedonia", "Skopje"), ("Montenegro", "Podgorica"),
    ("Bosnia and Herzegovina", "Sarajevo"), ("Cyprus", "Nicosia"), ("Malta", "Valletta"),
    ("Luxembourg", "Luxembourg"), ("Libya", "Tripoli"), ("Sudan", "Khartoum"),
    ("Tanzania", "Dodoma"), ("Angola", "Luanda"), ("Mozambique", "Maputo"),
    ("Zambia", "Lusaka"), ("Namibia", "Windhoek"), ("Botswana", "Gaborone"),
    ("Madagascar", "Antananarivo"), ("Cameroon", "Yaounde"), ("Mali", "Bamako"),
    ("Niger", "Niamey"), ("Chad", "N'Djamena|Ndjamena"), ("Somalia", "Mogadishu"),
    ("Rwanda", "Kigali"), ("Guinea", "Conakry"), ("Liberia", "Monrovia"),
    ("Sierra Leone", "Freetown"), ("Gabon", "Libreville"), ("Togo", "Lome"),
    ("Burkina Faso", "Ouagadougou"), ("Malawi", "Lilongwe"), ("Eritrea", "Asmara"),
    ("Yemen", "Sanaa|Sana'a"), ("Oman", "Muscat"), ("Kuwait", "Kuwait City"),
    ("Bahrain", "Manama"), ("United Arab Emirates", "Abu Dhabi"), ("Cambodia", "Phnom Penh"),
    ("Laos", "Vientiane"), ("Myanmar", "Naypyidaw|Nay Pyi Taw"), ("Singapore", "Singapore"),
    ("Bhutan", "Thimphu"), ("Kyrgyzstan", "Bishkek"), ("Tajikistan", "Dushanbe"),
    ("Turkmenistan", "Ashgabat"), ("Panama", "Panama City"), ("Costa Rica", "San Jose"),
    ("Nicaragua", "Managua"), ("Honduras", "Tegucigalpa"), ("El Salvador", "San Salvador"),
    ("Guatemala", "Guatemala City"), ("Dominican Republic", "Santo Domingo"),
    ("Haiti", "Port-au-Prince"), ("Bahamas", "Nassau"), ("Trinidad and Tobago", "Port of Spain"),
    ("Guyana", "Georgetown"), ("Suriname", "Paramaribo"), ("Papua New Guinea", "Port Moresby"),
    ("Fiji", "Suva"), ("Samoa", "Apia"), ("Monaco", "Monaco"), ("Andorra", "Andorra la Vella"),
    ("Liechtenstein", "Vaduz"), ("San Marino", "San Marino"),
)  # fmt: skip

HELDOUT_EVERY = 4  # index % 4 == 3 is held out


def split(name: str) -> list[tuple[str, str]]:
    """(country, answer) pairs of "train" or "heldout", in the table's order."""
    if name not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {name!r}")
    held = name == "heldout"
    return [c for i, c in enumerate(CAPITALS) if (i % HELDOUT_EVERY == HELDOUT_EVERY - 1) == held]


def rows(name: str) -> list[dict[str, str]]:
    """The JSONL rows of a split: {"question": prompt, "answer": capital[|alias...]}."""
    return [{"question": PROMPT.format(country=c), "answer": a} for c, a in split(name)]


def normalise(text: str) -> str:
    """Accents removed, lower case, runs of other characters than letters and digits one space,
    padded with a space on both sides (so a whole word is found as " word ")."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()
    return " " + " ".join(re.findall(r"[a-z0-9]+", plain)) + " "


_NAMES = tuple(sorted({normalise(alias) for _, answer in CAPITALS for alias in answer.split("|")}))


def capital(completion: str, answer: str) -> float:
    """1.0 when `completion` names the capital `answer` (or an alias) and no other capital."""
    text = normalise(completion)
    right = {normalise(alias) for alias in answer.split("|")}
    if not any(name in text for name in right):
        return 0.0
    for name in _NAMES:  # another capital, unless it is part of the right one ("Kuwait City")
        if name not in right and name in text and not any(name in r for r in right):
            return 0.0
    return 1.0


def main(out_dir: Path) -> None:
    """Write train.jsonl and heldout.jsonl into `out_dir`."""
    for name, file in (("train", "train.jsonl"), ("heldout", "heldout.jsonl")):
        lines = [json.dumps(row) for row in rows(name)]
        (out_dir / file).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
