"""The synthetic tasks every harness reads, once each: pass keys in Landmark's filler (``passkey``), the lab's
recall and key-value recall rows (``recall``, ``kv_recall``), RULER-style needles (``ruler``), the haystacks they
hide in (``haystack``, ``words``), one context of a given length with its needles (``context``) and the scoring of
an answer (``score``)."""
