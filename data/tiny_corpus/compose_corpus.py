"""Compose ``tiny_corpus.jsonl``: kilocard's small English corpus, written for this repository.

The corpus is the hand-written paragraphs in ``passages.txt`` plus paragraphs composed from the
sentence patterns below (field notes, letters, recipes, travel notes, weather and market
reports, short fables), drawn with a fixed seed so the output is the same on every run.
Everything here is original text; nothing is downloaded.

    python data/tiny_corpus/compose_corpus.py            # rewrites tiny_corpus.jsonl
    kilocard preprocess --input data/tiny_corpus/tiny_corpus.jsonl \\
        --output-prefix data/tiny_corpus/tiny_corpus       # rebuilds the .bin/.idx
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261130
COMPOSED_PARAGRAPHS = 1000

W = {
    "place": ["the village", "the harbour", "the old mill", "the valley", "the market town", "the island",
              "the farm on the hill", "the river crossing", "the mountain pass", "the quiet street",
              "the station", "the orchard", "the forest edge", "the lighthouse", "the bridge"],
    "person": ["the baker", "the miller", "the teacher", "the fisherman", "the old shepherd", "the doctor",
               "the carpenter", "the ferryman", "the innkeeper", "the gardener", "the clockmaker",
               "the young weaver", "the postman", "the blacksmith", "the farmer's daughter"],
    "animal": ["a fox", "a heron", "an owl", "a hare", "a crow", "a young deer", "a grey cat", "a sheepdog",
               "a pair of swans", "a badger", "a robin", "a goat"],
    "weather": ["rain", "fog", "a cold wind", "snow", "bright sunshine", "a light drizzle", "a heavy storm",
                "thin cloud", "frost", "a warm breeze"],
    "time": ["at dawn", "in the early morning", "before noon", "in the afternoon", "at dusk", "after dark",
             "late in the evening", "on the first day of spring", "in the middle of winter", "on market day"],
    "object": ["a wooden box", "an old letter", "a brass key", "a map of the coast", "a basket of apples",
               "a loaf of bread", "a broken lantern", "a silver coin", "a book of songs", "a length of rope",
               "a jar of honey", "a pair of boots"],
    "feeling": ["glad", "tired", "curious", "uneasy", "content", "surprised", "patient", "hopeful"],
    "food": ["onions", "carrots", "potatoes", "leeks", "beans", "barley", "mushrooms", "apples", "pears",
             "cabbage", "lentils", "tomatoes"],
    "herb": ["thyme", "parsley", "bay leaves", "rosemary", "sage", "mint", "black pepper", "a little nutmeg"],
    "bird": ["swallows", "starlings", "geese", "curlews", "gulls", "larks", "finches", "rooks"],
    "trade": ["wool", "cheese", "timber", "salt fish", "grain", "wine", "cloth", "pottery", "iron nails"],
    "direction": ["north", "south", "east", "west"],
    "number": ["two", "three", "four", "five", "six", "seven", "eight", "ten", "twelve", "twenty"],
    "day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "month": ["January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December"],
    "virtue": ["patience", "kindness", "honesty", "courage", "care", "humility"],
    "name": ["Anna", "Tomas", "Marta", "Ewan", "Ruth", "Jonas", "Clara", "Peter", "Ida", "Hugh", "Nora", "Simon"],
}

GENRES = {
    "field_notes": [
        "{Time}, {weather} over {place}.",
        "I saw {animal} near {place}, moving {direction} along the hedge.",
        "The {bird} have come back; I counted {number} of them on the roof of the barn.",
        "{Person} says the river is higher than it was last {month}.",
        "The ground is soft after the {weather2}, and the tracks are easy to follow.",
        "Nothing else of note, except that the path past {place} is blocked by a fallen tree.",
        "By evening the sky had cleared, and the first stars were out over {place}.",
    ],
    "letter": [
        "Dear {name},",
        "Thank you for your letter, which reached me on {day} with the rest of the post.",
        "We are all well here, though {weather} has kept us indoors for most of the week.",
        "{Person} asked after you, and I told him you would be back before {month}.",
        "I have found {object} in the attic, and I think it must have been your grandfather's.",
        "The garden is doing better than last year; the {food} are nearly ready.",
        "Write again when you can, and tell me everything about the town.",
        "With love, {name2}",
    ],
    "recipe": [
        "To make a plain stew of {food} and {food2}, wash and chop a bowlful of each.",
        "Warm a little oil in a heavy pot and cook the vegetables slowly until they soften.",
        "Add water to cover, a pinch of salt, and {herb}.",
        "Let it simmer for half an hour, stirring now and then, until everything is tender.",
        "Taste it, add more salt if it needs it, and serve it with bread and butter.",
        "It keeps well for a few days in a cool place and is better on the second day.",
    ],
    "travel": [
        "We left {place} {time} and walked {direction} along the old road.",
        "The way climbed steadily for {number} miles through fields and small woods.",
        "At noon we rested by a stream and ate bread, cheese and a few {food}.",
        "{Weather} came on in the afternoon, and we were glad to reach an inn before dark.",
        "The innkeeper gave us a room under the roof and a supper of {food} and bread.",
        "In the morning we could see {place2} far below us, small and bright in the sun.",
    ],
    "market": [
        "Market report for {day}, {month}.",
        "Trade in {trade} was steady, and prices were a little higher than last week.",
        "{Number} carts came in from the {direction} with {food} and {food2}.",
        "{Person} sold out of {trade2} before noon.",
        "The weather, {weather}, kept some buyers away in the afternoon.",
        "Next market day the square will open an hour earlier, by order of the council.",
    ],
    "fable": [
        "Once, {animal} lived near {place}.",
        "Every day it watched {person} carry {object} up the hill and down again.",
        "One day it asked why, and {person} said, \"Because someone must, and today it is me.\"",
        "The next morning {animal} went with {person} and helped to carry the load.",
        "They were both {feeling} when they reached the top, and the work was half as hard.",
        "That is why the people of {place} still say that {virtue} makes a heavy load light.",
    ],
    "weather_report": [
        "Weather for {place}, {day}.",
        "The morning will begin with {weather}, clearing slowly from the {direction}.",
        "Winds will be light, turning {direction2} by evening.",
        "Temperatures will be mild for {month}, with {weather2} likely after dark.",
        "Fishermen should expect a moderate swell near {place2}.",
        "The outlook for the weekend is settled, with long dry spells.",
    ],
}


def _slots(rng: random.Random) -> dict:
    """One draw of every slot (and a second, different word as ``slot2``) for a whole paragraph."""
    slots = {}
    for key, words in W.items():
        first, second = rng.sample(words, 2)
        slots[key], slots[key + "2"] = first, second
        slots[key.capitalize()] = first[0].upper() + first[1:]
        slots[key.capitalize() + "2"] = second[0].upper() + second[1:]
    return slots


def composed_paragraph(rng: random.Random) -> str:
    """One paragraph: a genre, then most of its sentences in order, slots drawn from the word lists."""
    genre = rng.choice(sorted(GENRES))
    slots = _slots(rng)
    lines = GENRES[genre]
    keep = [line for i, line in enumerate(lines) if i == 0 or rng.random() < 0.8]
    glue = "\n" if genre == "letter" else " "
    return glue.join(line.format(**slots) for line in keep)


def documents() -> list:
    """Hand-written passages first, then the composed paragraphs, shuffled together."""
    rng = random.Random(SEED)
    passages = [p.strip().replace("\n", " ") for p in (HERE / "passages.txt").read_text().split("\n\n") if p.strip()]
    composed = [composed_paragraph(rng) for _ in range(COMPOSED_PARAGRAPHS)]
    docs = passages + composed
    rng.shuffle(docs)
    return docs


def main() -> None:
    out = HERE / "tiny_corpus.jsonl"
    with out.open("w", encoding="utf-8") as f:
        for text in documents():
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"wrote {out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
