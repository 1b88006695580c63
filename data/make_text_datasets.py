"""Make the cookbook's small text datasets (offline stand-ins for hub datasets), with fixed seeds.

    python data/make_text_datasets.py          # rewrites data/<name>/{train,test}.jsonl

Every set is templated text with real structure (arithmetic, translations of a small vocabulary,
spelling, sorting, table look-ups, document -> JSON extraction), so a tiny model trained for a minute on
CPU lowers its eval loss clearly, and a real model can learn it fully. See data/README.md for what
each set stands in for and how it is loaded. Test rows never repeat a train row.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parent

LANGS = ["en", "fr", "de", "es", "it"]
# LANG_NAMES[speaker][lang]: the name of `lang` in the language `speaker`.
LANG_NAMES = {
    "en": {"en": "English", "fr": "French", "de": "German", "es": "Spanish", "it": "Italian"},
    "fr": {"en": "anglais", "fr": "français", "de": "allemand", "es": "espagnol", "it": "italien"},
    "de": {"en": "Englisch", "fr": "Französisch", "de": "Deutsch", "es": "Spanisch", "it": "Italienisch"},
    "es": {"en": "inglés", "fr": "francés", "de": "alemán", "es": "español", "it": "italiano"},
    "it": {"en": "inglese", "fr": "francese", "de": "tedesco", "es": "spagnolo", "it": "italiano"},
}
# A small vocabulary in the five languages: en, fr, de, es, it.
WORDS = [
    ("red", "rouge", "rot", "rojo", "rosso"),
    ("blue", "bleu", "blau", "azul", "blu"),
    ("green", "vert", "grün", "verde", "verde"),
    ("yellow", "jaune", "gelb", "amarillo", "giallo"),
    ("black", "noir", "schwarz", "negro", "nero"),
    ("white", "blanc", "weiß", "blanco", "bianco"),
    ("cat", "chat", "Katze", "gato", "gatto"),
    ("dog", "chien", "Hund", "perro", "cane"),
    ("bird", "oiseau", "Vogel", "pájaro", "uccello"),
    ("fish", "poisson", "Fisch", "pez", "pesce"),
    ("horse", "cheval", "Pferd", "caballo", "cavallo"),
    ("house", "maison", "Haus", "casa", "casa"),
    ("water", "eau", "Wasser", "agua", "acqua"),
    ("bread", "pain", "Brot", "pan", "pane"),
    ("apple", "pomme", "Apfel", "manzana", "mela"),
    ("book", "livre", "Buch", "libro", "libro"),
    ("sun", "soleil", "Sonne", "sol", "sole"),
    ("moon", "lune", "Mond", "luna", "luna"),
    ("tree", "arbre", "Baum", "árbol", "albero"),
    ("school", "école", "Schule", "escuela", "scuola"),
    ("friend", "ami", "Freund", "amigo", "amico"),
    ("city", "ville", "Stadt", "ciudad", "città"),
    ("car", "voiture", "Auto", "coche", "macchina"),
    ("milk", "lait", "Milch", "leche", "latte"),
    ("Monday", "lundi", "Montag", "lunes", "lunedì"),
    ("Sunday", "dimanche", "Sonntag", "domingo", "domenica"),
    ("window", "fenêtre", "Fenster", "ventana", "finestra"),
    ("garden", "jardin", "Garten", "jardín", "giardino"),
]
COUNTRIES = [  # country, capital, main language, continent
    ("France", "Paris", "French", "Europe"),
    ("Germany", "Berlin", "German", "Europe"),
    ("Spain", "Madrid", "Spanish", "Europe"),
    ("Italy", "Rome", "Italian", "Europe"),
    ("Portugal", "Lisbon", "Portuguese", "Europe"),
    ("Poland", "Warsaw", "Polish", "Europe"),
    ("Greece", "Athens", "Greek", "Europe"),
    ("Sweden", "Stockholm", "Swedish", "Europe"),
    ("Japan", "Tokyo", "Japanese", "Asia"),
    ("China", "Beijing", "Mandarin", "Asia"),
    ("India", "New Delhi", "Hindi", "Asia"),
    ("Thailand", "Bangkok", "Thai", "Asia"),
    ("Egypt", "Cairo", "Arabic", "Africa"),
    ("Kenya", "Nairobi", "Swahili", "Africa"),
    ("Brazil", "Brasília", "Portuguese", "South America"),
    ("Argentina", "Buenos Aires", "Spanish", "South America"),
    ("Peru", "Lima", "Spanish", "South America"),
    ("Canada", "Ottawa", "English", "North America"),
    ("Mexico", "Mexico City", "Spanish", "North America"),
    ("Australia", "Canberra", "English", "Oceania"),
]
ANTONYMS = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("happy", "sad"), ("light", "dark"),
    ("open", "closed"), ("early", "late"), ("high", "low"), ("strong", "weak"), ("full", "empty"),
    ("old", "new"), ("rich", "poor"), ("hard", "soft"), ("long", "short"), ("wet", "dry"),
    ("up", "down"), ("inside", "outside"), ("first", "last"), ("loud", "quiet"), ("clean", "dirty"),
]
PLURALS = [
    ("child", "children"), ("mouse", "mice"), ("foot", "feet"), ("tooth", "teeth"), ("man", "men"),
    ("woman", "women"), ("person", "people"), ("goose", "geese"), ("box", "boxes"), ("city", "cities"),
    ("knife", "knives"), ("leaf", "leaves"), ("book", "books"), ("car", "cars"), ("church", "churches"),
    ("baby", "babies"), ("wolf", "wolves"), ("bus", "buses"), ("tree", "trees"), ("glass", "glasses"),
]
ENGLISH_WORDS = [w[0] for w in WORDS if w[0][0].islower()] + [
    "river", "planet", "orange", "pencil", "table", "chair", "music", "winter", "summer", "cloud",
    "forest", "island", "bridge", "rocket", "silver", "garden", "letter", "market", "station", "kitchen",
]


# --------------------------------------------------------------------------------------------------
# Multilingual reasoning chat (shape of HuggingFaceH4/Multilingual-Thinking)
# --------------------------------------------------------------------------------------------------
def _spell(word: str) -> str:
    return "-".join(word)


def _numbers(xs) -> str:
    return ", ".join(str(x) for x in xs)


QUOTE = {"en": ('"', '"'), "fr": ("« ", " »"), "de": ("„", "“"), "es": ('"', '"'), "it": ('"', '"')}


def _q(lang: str, text: str) -> str:
    left, right = QUOTE[lang]
    return f"{left}{text}{right}"


REASONING_TASKS = {
    "add": {
        "user": {
            "en": "What is {a} + {b}?", "fr": "Combien font {a} + {b} ?", "de": "Was ist {a} + {b}?",
            "es": "¿Cuánto es {a} + {b}?", "it": "Quanto fa {a} + {b}?",
        },
        "analysis": {
            "en": "The user asks for the sum of {a} and {b}. Ones: {a1} + {b1} = {s1}. Tens: {a10} + {b10} = {s10}. "
                  "So {a} + {b} = {c}. I answer {c} in {user_lang}.",
            "fr": "L'utilisateur demande la somme de {a} et {b}. Unités : {a1} + {b1} = {s1}. Dizaines : {a10} + {b10} = {s10}. "
                  "Donc {a} + {b} = {c}. Je réponds {c} en {user_lang}.",
            "de": "Der Benutzer fragt nach der Summe von {a} und {b}. Einer: {a1} + {b1} = {s1}. Zehner: {a10} + {b10} = {s10}. "
                  "Also {a} + {b} = {c}. Ich antworte {c} auf {user_lang}.",
            "es": "El usuario pide la suma de {a} y {b}. Unidades: {a1} + {b1} = {s1}. Decenas: {a10} + {b10} = {s10}. "
                  "Entonces {a} + {b} = {c}. Respondo {c} en {user_lang}.",
            "it": "L'utente chiede la somma di {a} e {b}. Unità: {a1} + {b1} = {s1}. Decine: {a10} + {b10} = {s10}. "
                  "Quindi {a} + {b} = {c}. Rispondo {c} in {user_lang}.",
        },
        "final": {
            "en": "{a} + {b} = {c}.", "fr": "{a} + {b} font {c}.", "de": "{a} + {b} ist {c}.",
            "es": "{a} + {b} es {c}.", "it": "{a} + {b} fa {c}.",
        },
    },
    "translate": {
        "user": {
            "en": "How do you say {w} in {target}?", "fr": "Comment dit-on {w} en {target} ?",
            "de": "Wie sagt man {w} auf {target}?", "es": "¿Cómo se dice {w} en {target}?",
            "it": "Come si dice {w} in {target}?",
        },
        "analysis": {
            "en": "The word {w} is {source} and means {meaning}. In {target} it is {t}.",
            "fr": "Le mot {w} est en {source} et signifie {meaning}. En {target}, c'est {t}.",
            "de": "Das Wort {w} ist {source} und bedeutet {meaning}. Auf {target} heißt es {t}.",
            "es": "La palabra {w} está en {source} y significa {meaning}. En {target} es {t}.",
            "it": "La parola {w} è in {source} e significa {meaning}. In {target} si dice {t}.",
        },
        "final": {
            "en": "In {target}, {w} is {t}.", "fr": "En {target}, {w} se dit {t}.",
            "de": "Auf {target} heißt {w} {t}.", "es": "En {target}, {w} se dice {t}.",
            "it": "In {target}, {w} si dice {t}.",
        },
    },
    "sort": {
        "user": {
            "en": "Sort these numbers from smallest to largest: {xs}.",
            "fr": "Trie ces nombres du plus petit au plus grand : {xs}.",
            "de": "Sortiere diese Zahlen aufsteigend: {xs}.",
            "es": "Ordena estos números de menor a mayor: {xs}.",
            "it": "Ordina questi numeri dal più piccolo al più grande: {xs}.",
        },
        "analysis": {
            "en": "The numbers are {xs}. The smallest is {lo}, the largest is {hi}. In order: {ys}.",
            "fr": "Les nombres sont {xs}. Le plus petit est {lo}, le plus grand est {hi}. Dans l'ordre : {ys}.",
            "de": "Die Zahlen sind {xs}. Die kleinste ist {lo}, die größte ist {hi}. Geordnet: {ys}.",
            "es": "Los números son {xs}. El menor es {lo}, el mayor es {hi}. En orden: {ys}.",
            "it": "I numeri sono {xs}. Il più piccolo è {lo}, il più grande è {hi}. In ordine: {ys}.",
        },
        "final": {
            "en": "In order: {ys}.", "fr": "Dans l'ordre : {ys}.", "de": "Geordnet: {ys}.",
            "es": "En orden: {ys}.", "it": "In ordine: {ys}.",
        },
    },
    "count": {
        "user": {
            "en": "How many letters are in the word {w}?", "fr": "Combien de lettres y a-t-il dans le mot {w} ?",
            "de": "Wie viele Buchstaben hat das Wort {w}?", "es": "¿Cuántas letras tiene la palabra {w}?",
            "it": "Quante lettere ha la parola {w}?",
        },
        "analysis": {
            "en": "Spelling it: {spelled}. That is {n} letters.", "fr": "Je l'épelle : {spelled}. Cela fait {n} lettres.",
            "de": "Buchstabiert: {spelled}. Das sind {n} Buchstaben.", "es": "Deletreo: {spelled}. Son {n} letras.",
            "it": "Lo scandisco: {spelled}. Sono {n} lettere.",
        },
        "final": {
            "en": "{w} has {n} letters.", "fr": "{w} a {n} lettres.", "de": "{w} hat {n} Buchstaben.",
            "es": "{w} tiene {n} letras.", "it": "{w} ha {n} lettere.",
        },
    },
    "reverse": {
        "user": {
            "en": "Write the word {w} backwards.", "fr": "Écris le mot {w} à l'envers.",
            "de": "Schreibe das Wort {w} rückwärts.", "es": "Escribe la palabra {w} al revés.",
            "it": "Scrivi la parola {w} al contrario.",
        },
        "analysis": {
            "en": "Letters: {spelled}. Reversed: {rspelled}. Joined: {r}.",
            "fr": "Lettres : {spelled}. À l'envers : {rspelled}. Ensemble : {r}.",
            "de": "Buchstaben: {spelled}. Rückwärts: {rspelled}. Zusammen: {r}.",
            "es": "Letras: {spelled}. Al revés: {rspelled}. Juntas: {r}.",
            "it": "Lettere: {spelled}. Al contrario: {rspelled}. Unite: {r}.",
        },
        "final": {
            "en": "{w} backwards is {r}.", "fr": "{w} à l'envers donne {r}.", "de": "{w} rückwärts ist {r}.",
            "es": "{w} al revés es {r}.", "it": "{w} al contrario è {r}.",
        },
    },
}
# The real set names the reasoning language in English in its developer/system prompt.
REASONING_LANGUAGE = {"en": "English", "fr": "French", "de": "German", "es": "Spanish", "it": "Italian"}


def reasoning_example(rng: random.Random) -> dict:
    task = rng.choice(sorted(REASONING_TASKS))
    user_lang, think_lang = rng.choice(LANGS), rng.choice(LANGS)
    # Each template is filled per language: quotes and language names follow the sentence's language.
    fill = {}
    if task == "add":
        a, b = rng.randint(10, 89), rng.randint(10, 89)
        fill = lambda lang: dict(a=a, b=b, c=a + b, a1=a % 10, b1=b % 10, s1=a % 10 + b % 10,  # noqa: E731
                                 a10=a // 10 * 10, b10=b // 10 * 10, s10=a // 10 * 10 + b // 10 * 10,
                                 user_lang=LANG_NAMES[lang][user_lang])
    elif task == "translate":
        row = rng.choice(WORDS)
        target = rng.choice([lang for lang in LANGS if lang != user_lang])
        word, t = row[LANGS.index(user_lang)], row[LANGS.index(target)]
        fill = lambda lang: dict(w=_q(lang, word), t=_q(lang, t), target=LANG_NAMES[lang][target],  # noqa: E731
                                 source=LANG_NAMES[lang][user_lang], meaning=_q(lang, row[LANGS.index(lang)]))
    elif task == "sort":
        xs = rng.sample(range(1, 100), rng.randint(3, 5))
        ys = sorted(xs)
        fill = lambda lang: dict(xs=_numbers(xs), ys=_numbers(ys), lo=ys[0], hi=ys[-1])  # noqa: E731
    else:  # count, reverse: a word of the user's language
        word = rng.choice(WORDS)[LANGS.index(user_lang)]
        fill = lambda lang: dict(w=_q(lang, word), spelled=_spell(word), n=len(word),  # noqa: E731
                                 rspelled=_spell(word[::-1]), r=_q(lang, word[::-1]))
    templates = REASONING_TASKS[task]
    user = templates["user"][user_lang].format(**fill(user_lang))
    analysis = templates["analysis"][think_lang].format(**fill(think_lang))
    final = templates["final"][user_lang].format(**fill(user_lang))
    developer = f"reasoning language: {REASONING_LANGUAGE[think_lang]}"
    return {
        "reasoning_language": REASONING_LANGUAGE[think_lang],
        "developer": developer,
        "user": user,
        "analysis": analysis,
        "final": final,
        "messages": [
            {"role": "system", "content": developer, "thinking": None},
            {"role": "user", "content": user, "thinking": None},
            {"role": "assistant", "content": final, "thinking": analysis},
        ],
    }


# --------------------------------------------------------------------------------------------------
# Multi-turn conversations (shape of trl-lib/Capybara) and ShareGPT (shape of mlabonne/FineTome-100k)
# --------------------------------------------------------------------------------------------------
def conversation_turns(rng: random.Random) -> list[tuple[str, str]]:
    """A 2-3 turn English conversation as (user, assistant) pairs; later turns depend on earlier ones."""
    kind = rng.choice(["arithmetic", "country", "spelling"])
    turns = []
    if kind == "arithmetic":
        a, b, k, m = rng.randint(2, 60), rng.randint(2, 60), rng.randint(2, 5), rng.randint(1, 20)
        c = a + b
        turns.append((f"What is {a} + {b}?", f"{a} + {b} = {c}."))
        turns.append((f"Multiply that by {k}.", f"{c} × {k} = {c * k}."))
        if rng.random() < 0.6:
            turns.append((f"Now subtract {m}.", f"{c * k} - {m} = {c * k - m}."))
    elif kind == "country":
        country, capital, language, continent = rng.choice(COUNTRIES)
        turns.append((f"What is the capital of {country}?", f"The capital of {country} is {capital}."))
        follow_ups = [
            ("Which continent is it in?", f"{country} is in {continent}."),
            ("What language do people speak there?", f"The main language of {country} is {language}."),
        ]
        rng.shuffle(follow_ups)
        turns.extend(follow_ups[: rng.randint(1, 2)])
    else:
        word = rng.choice(ENGLISH_WORDS)
        turns.append((f"Spell the word {word}.", f"{word} is spelled {_spell(word)}."))
        follow_ups = [
            ("How many letters is that?", f"{word} has {len(word)} letters."),
            ("Write it backwards.", f"Backwards, {word} is {word[::-1]}."),
        ]
        rng.shuffle(follow_ups)
        turns.extend(follow_ups[: rng.randint(1, 2)])
    return turns


def capybara_example(rng: random.Random) -> dict:
    messages = []
    for user, assistant in conversation_turns(rng):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


def finetome_turn(rng: random.Random) -> tuple[str, str, str]:
    """(source, question, answer) of one explained single-turn exchange."""
    kind = rng.choice(["units", "multiples", "parity", "plural"])
    if kind == "units":
        x = rng.randint(2, 40)
        one, unit, small, factor = rng.choice([("kilometer", "kilometers", "meters", 1000),
                                               ("meter", "meters", "centimeters", 100),
                                               ("hour", "hours", "minutes", 60),
                                               ("kilogram", "kilograms", "grams", 1000)])
        return ("standin-units", f"Convert {x} {unit} to {small}.",
                f"One {one} is {factor} {small}, so {x} {unit} are {x} × {factor} = {x * factor} {small}.")
    if kind == "multiples":
        n, k = rng.randint(3, 6), rng.randint(2, 12)
        values = ", ".join(str(k * i) for i in range(1, n + 1))
        return ("standin-multiples", f"List the first {n} multiples of {k}.",
                f"Multiply {k} by 1 to {n}: the first {n} multiples of {k} are {values}.")
    if kind == "parity":
        n = rng.randint(1, 999)
        answer = (f"{n} is even, because {n} = 2 × {n // 2}." if n % 2 == 0
                  else f"{n} is odd, because {n} = 2 × {n // 2} + 1 leaves a remainder of 1.")
        return "standin-parity", f"Is {n} even or odd? Explain.", answer
    singular, plural = rng.choice(PLURALS)
    return "standin-plurals", f"What is the plural of {singular}?", f"The plural of {singular} is {plural}."


def finetome_example(rng: random.Random) -> dict:
    source, question, answer = finetome_turn(rng)
    conversations = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    if rng.random() < 0.3:
        _, question2, answer2 = finetome_turn(rng)
        conversations += [{"from": "human", "value": question2}, {"from": "gpt", "value": answer2}]
    return {"conversations": conversations, "source": source, "score": round(rng.uniform(4.0, 5.2), 4)}


# --------------------------------------------------------------------------------------------------
# Instructions (shape of tatsu-lab/alpaca) and messages (shape of alpaca_messages_2k_test)
# --------------------------------------------------------------------------------------------------
ALPACA_WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further "
                     "context. Write a response that appropriately completes the request.\n\n"
                     "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n{output}")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n{output}")


def instruction_triple(rng: random.Random) -> tuple[str, str, str]:
    kind = rng.choice(["fahrenheit", "sort", "antonym", "parity", "capital", "translate"])
    if kind == "fahrenheit":
        c = rng.randrange(-20, 45, 5)
        return "Convert the temperature from Celsius to Fahrenheit.", f"{c} °C", f"{c} °C is {c * 9 // 5 + 32} °F."
    if kind == "sort":
        xs = rng.sample(range(1, 100), rng.randint(3, 6))
        return "Sort the following list of numbers in ascending order.", _numbers(xs), _numbers(sorted(xs))
    if kind == "antonym":
        word, opposite = rng.choice(ANTONYMS)
        if rng.random() < 0.5:
            word, opposite = opposite, word
        return "Give the opposite of the given word.", word, f"The opposite of {word} is {opposite}."
    if kind == "parity":
        n = rng.randint(1, 999)
        return "Classify the following number as even or odd.", str(n), f"{n} is {'even' if n % 2 == 0 else 'odd'}."
    if kind == "capital":
        country, capital, _, _ = rng.choice(COUNTRIES)
        return f"Name the capital city of {country}.", "", f"The capital of {country} is {capital}."
    row = rng.choice(WORDS)
    target = rng.choice(LANGS[1:])
    return (f"Translate the following word into {LANG_NAMES['en'][target]}.", row[0],
            f"{row[0]} in {LANG_NAMES['en'][target]} is {row[LANGS.index(target)]}.")


def alpaca_example(rng: random.Random) -> dict:
    instruction, input_, output = instruction_triple(rng)
    template = ALPACA_WITH_INPUT if input_ else ALPACA_NO_INPUT
    return {"instruction": instruction, "input": input_, "output": output,
            "text": template.format(instruction=instruction, input=input_, output=output)}


def alpaca_messages_example(rng: random.Random) -> dict:
    instruction, input_, output = instruction_triple(rng)
    user = f"{instruction}\n\n{input_}" if input_ else instruction
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": output}]}


# --------------------------------------------------------------------------------------------------
# Invoices and receipts: document text -> JSON entities, prompt/completion
# --------------------------------------------------------------------------------------------------
VENDORS = [
    ("Northwind Traders", "12 Harbour Road, Bristol"), ("Blue Heron Supplies", "4 Mill Lane, Leeds"),
    ("Acme Tools GmbH", "Hauptstraße 8, Munich"), ("Soleil Papeterie", "21 rue des Lilas, Lyon"),
    ("Casa Verde S.L.", "Calle Mayor 15, Valencia"), ("Lumen Office Srl", "Via Roma 3, Turin"),
    ("Pinecrest Hardware", "88 Oak Street, Denver"), ("Orbit Electronics", "501 Market Street, Austin"),
]
STORES = ["Fresh Market", "Corner Café", "City Pharmacy", "Green Grocer", "Book Nook", "Metro Bakery"]
CUSTOMERS = ["Ada Lovelace Ltd", "Grace Hopper Inc", "Alan Turing & Co", "Marie Curie SA", "Emmy Noether GmbH",
             "Katherine Johnson LLC", "Nikola Tesla Srl", "Rosalind Franklin Ltd"]
ITEMS = [("Printer paper", 4.5), ("Ink cartridge", 19.99), ("Stapler", 7.25), ("Desk lamp", 24.0),
         ("USB cable", 5.99), ("Notebook", 2.75), ("Office chair", 89.0), ("Monitor stand", 34.5),
         ("Coffee beans", 12.4), ("Whiteboard", 45.0), ("Pens (box)", 6.3), ("Keyboard", 29.9)]
RECEIPT_ITEMS = [("Milk", 1.19), ("Bread", 2.49), ("Apples", 3.2), ("Coffee", 3.5), ("Croissant", 1.8),
                 ("Tea", 2.1), ("Aspirin", 4.99), ("Novel", 12.99), ("Cheese", 5.75), ("Orange juice", 2.99)]
CURRENCIES = [("EUR", "€"), ("USD", "$"), ("GBP", "£")]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
EXTRACTION_PROMPT = "Extract the key fields of this document as JSON. Reply with the JSON object only.\n\n{document}"


def _date_text(rng: random.Random, year: int, month: int, day: int) -> str:
    style = rng.randrange(4)
    if style == 0:
        return f"{year}-{month:02d}-{day:02d}"
    if style == 1:
        return f"{day:02d}/{month:02d}/{year}"
    if style == 2:
        return f"{day} {MONTHS[month - 1]} {year}"
    return f"{MONTHS[month - 1]} {day}, {year}"


def _money(rng: random.Random, amount: float, currency: str, symbol: str) -> str:
    return f"{symbol}{amount:.2f}" if rng.random() < 0.5 else f"{amount:.2f} {currency}"


def invoice_document(rng: random.Random) -> tuple[str, dict]:
    year, month, day = rng.randint(2021, 2025), rng.randint(1, 12), rng.randint(1, 28)
    currency, symbol = rng.choice(CURRENCIES)
    lines = rng.sample(ITEMS if rng.random() < 0.5 else RECEIPT_ITEMS, rng.randint(1, 4))
    quantities = [rng.randint(1, 5) for _ in lines]
    total = round(sum(q * price for q, (_, price) in zip(quantities, lines)), 2)
    date = _date_text(rng, year, month, day)
    if rng.random() < 0.5:
        (vendor, address), customer = rng.choice(VENDORS), rng.choice(CUSTOMERS)
        number = f"INV-{year}-{rng.randint(1, 9999):04d}"
        items = "\n".join(f"  {q} x {name} @ {price:.2f} = {q * price:.2f}" for q, (name, price) in zip(quantities, lines))
        document = (f"INVOICE\n{vendor}\n{address}\nInvoice No: {number}\nDate: {date}\nBill to: {customer}\n"
                    f"Items:\n{items}\nTotal due: {_money(rng, total, currency, symbol)}")
        entities = {"document_type": "invoice", "vendor": vendor, "invoice_number": number,
                    "date": f"{year}-{month:02d}-{day:02d}", "customer": customer, "currency": currency,
                    "total": f"{total:.2f}"}
    else:
        vendor, number = rng.choice(STORES), str(rng.randint(10000, 99999))
        payment = rng.choice(["card", "cash"])
        items = "\n".join(f"{name} x{q}  {q * price:.2f}" for q, (name, price) in zip(quantities, lines))
        document = (f"{vendor.upper()}\nRECEIPT #{number}\n{date}\n{items}\n"
                    f"TOTAL {_money(rng, total, currency, symbol)}\nPaid by {payment}")
        entities = {"document_type": "receipt", "vendor": vendor, "receipt_number": number,
                    "date": f"{year}-{month:02d}-{day:02d}", "currency": currency, "total": f"{total:.2f}",
                    "payment_method": payment}
    return document, entities


def invoice_example(rng: random.Random) -> dict:
    document, entities = invoice_document(rng)
    return {
        "prompt": [{"role": "user", "content": EXTRACTION_PROMPT.format(document=document)}],
        "completion": [{"role": "assistant", "content": json.dumps(entities, ensure_ascii=False)}],
    }


# --------------------------------------------------------------------------------------------------
DATASETS = {  # folder -> (example maker, train rows, test rows, seed)
    "multilingual_thinking": (reasoning_example, 1000, 100, 101),
    "capybara": (capybara_example, 1000, 100, 102),
    "finetome": (finetome_example, 1000, 100, 103),
    "alpaca": (alpaca_example, 1000, 100, 104),
    "alpaca_messages": (alpaca_messages_example, 2000, 200, 105),
    "invoices": (invoice_example, 800, 100, 106),
}


def make_splits(make_example, n_train: int, n_test: int, seed: int) -> tuple[list, list]:
    """Draw distinct rows until both splits are full, so no test row repeats a train row."""
    rng, seen, rows = random.Random(seed), set(), []
    for _ in range(100 * (n_train + n_test)):
        row = make_example(rng)
        key = json.dumps(row, sort_keys=True, ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            rows.append(row)
        if len(rows) == n_train + n_test:
            return rows[:n_train], rows[n_train:]
    raise RuntimeError(f"{make_example.__name__}: only {len(rows)} distinct rows; widen its templates")


def write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    for name, (make_example, n_train, n_test, seed) in DATASETS.items():
        train, test = make_splits(make_example, n_train, n_test, seed)
        write_jsonl(DATA / name / "train.jsonl", train)
        write_jsonl(DATA / name / "test.jsonl", test)
        size = sum((DATA / name / f"{split}.jsonl").stat().st_size for split in ("train", "test"))
        print(f"{name:24s} train {len(train):5d}  test {len(test):4d}  {size / 1e3:7.1f} kB")


if __name__ == "__main__":
    main()
