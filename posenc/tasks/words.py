"""Word lists the long-context tasks draw their keys, names and common words from.

Keys are ``adjective-noun`` pairs (RULER, arXiv 2404.06654, draws its keys from a word list the same way), so
every needle of a context has a key no other needle and no haystack sentence shares. Variable names for the
variable-tracking task are five capital letters (RULER's ``VAR ABCDE``). The words are ordinary English, so
any tokenizer splits them into a few tokens.
"""

from __future__ import annotations

ADJECTIVES = (
    "amber", "ancient", "bitter", "bold", "brave", "bright", "calm", "clever", "crimson", "curious", "dusty",
    "eager", "early", "fancy", "fierce", "frozen", "gentle", "giant", "golden", "green", "hidden", "hollow",
    "humble", "icy", "jolly", "lively", "lonely", "lucky", "marble", "merry", "misty", "modest", "noble",
    "odd", "pale", "polite", "proud", "purple", "quiet", "rapid", "rosy", "rustic", "scarlet", "shy", "silent",
    "silver", "sleepy", "smooth", "solid", "spicy", "steady", "stormy", "sunny", "swift", "tidy", "tiny",
    "velvet", "vivid", "wild", "windy", "wooden", "young",
)

NOUNS = (
    "anchor", "apple", "arrow", "badger", "banjo", "barrel", "beacon", "biscuit", "blanket", "bottle", "bridge",
    "bucket", "cactus", "camel", "candle", "canyon", "carpet", "castle", "cherry", "chimney", "clock", "cloud",
    "compass", "cookie", "cotton", "crayon", "dolphin", "donkey", "drum", "engine", "falcon", "feather",
    "fiddle", "garden", "glacier", "goblet", "guitar", "hammer", "harbor", "helmet", "island", "jacket",
    "kettle", "ladder", "lantern", "lemon", "magnet", "meadow", "mirror", "mitten", "mountain", "needle",
    "orchard", "otter", "paddle", "pebble", "pepper", "pillow", "planet", "pocket", "puzzle", "rabbit",
    "ribbon", "river", "rocket", "saddle", "sandal", "saucer", "shovel", "spoon", "squirrel", "statue",
    "teapot", "thimble", "tiger", "tractor", "trumpet", "tunnel", "turnip", "violin", "wagon", "walnut",
    "window", "zebra",
)
