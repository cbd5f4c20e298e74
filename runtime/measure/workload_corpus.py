"""The prompt corpus of generated workloads: a few paragraphs of plain English prose (written for
trtpipe, free to use). Prompts are slices of its token ids (:mod:`trtpipe.runtime.measure.workload`), so
they read like ordinary text to the model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


# A few paragraphs of plain prose (written for trtpipe, free to use). Prompts are slices of its
# token ids, so they read like ordinary English text to the model.
CORPUS = """\
The lighthouse stood at the end of a long spit of sand, and for most of the year nobody went \
there but the keeper and the gulls. Every evening, a little before sunset, the keeper climbed \
the hundred and twelve steps of the tower, wiped the salt from the great lens, trimmed the wick, \
and waited for the moment when the sea and the sky became the same grey. Then he lit the lamp. \
He had done this for thirty years, and in all that time the light had never failed, not in the \
winter storms that threw spray over the gallery rail, nor in the summer fogs that came in so \
thick that he could not see his own hand on the door.

The village on the mainland depended on that light more than it liked to admit. The fishing \
boats went out before dawn and came back in the dark, and the channel between the rocks was \
narrow enough that a careless helmsman could lose his boat in a single wave. The older fishermen \
said that they could find the channel with their eyes closed, but they still looked for the \
light, and they were always glad to see it. Children in the village learned to count the \
flashes before they learned to read: three short, one long, and then darkness for the space of \
ten heartbeats.

In the spring a young engineer arrived from the city with a leather case full of drawings. The \
government, she explained, had decided to replace the old lamp with an electric one that would \
run by itself. It would turn on when the light faded and turn off when the sun came up, and it \
would never need a keeper at all. She was polite about it, and she admired the brass fittings \
and the careful way the logbooks had been kept, but she did not pretend that the decision could \
be changed. The keeper listened, made her a cup of tea, and asked how the new lamp would know \
when the fog was coming in.

The question stayed with her. Over the following weeks she measured everything she could think \
of: the height of the tower, the angle of the beam, the time it took the lens to turn, the way \
the light scattered in mist of different thickness. She found that the old keeper had been \
adjusting the lamp by hand on foggy nights, slowing the rotation so that each flash lasted a \
little longer and reached a little farther. None of this was written in any manual. He had \
simply noticed, years ago, that the boats found the channel more easily that way, and he had \
kept doing it.

When the new system was finally installed, it included a small instrument that measured the \
water in the air and slowed the lens when the fog grew thick. The engineer wrote the keeper's \
name in the margin of the design, next to the formula she had derived from his logbooks. The \
keeper retired to a cottage in the village, where he could still see the tower from his kitchen \
window. On clear evenings he counted the flashes out of habit, and on foggy nights he noticed, \
with some satisfaction, that they lasted a little longer than they used to.

Far inland, in a town built where two rivers met, there was a library that had been open every \
day for a hundred and fifty years. Its reading room had tall windows facing north, so that the \
light on the long oak tables was even and cool from morning to evening. Scholars came from other \
countries to study its maps, which showed the rivers as they had been before the great floods \
changed their courses, and farmers came to look up the boundaries of fields that their \
grandparents had argued about. The librarians knew most of the regular visitors by name, and \
they had a quiet way of placing the right book on a table before anyone had asked for it.

The oldest of the librarians kept a notebook in which she recorded every question that the \
catalogue could not answer. Where had the ferry crossed the river before the bridge was built? \
Which year had the orchards on the eastern hill been planted? Why did the old road bend so \
sharply at the mill? Over the decades the notebook grew into three volumes, and younger staff \
began to consult it as if it were another part of the collection. Many of the answers had been \
found by accident, in letters, account books and the margins of sermons, and each one was \
written down together with the place where it had been found.

People sometimes asked her why she bothered, since most of the questions were small and most \
of the answers changed nothing. She would reply that a town is held together by small facts as \
much as by large ones, and that a question nobody can answer tends to become a story that \
everybody believes. It was better, she thought, to know exactly where the ferry had crossed \
than to argue about it every winter. When she retired, the town council voted to print her \
notebooks, and the printed copies were placed on the open shelves, beside the maps.
"""


def corpus_token_ids(tokenizer: Encoder) -> list[int]:
    """Token ids of :data:`CORPUS` (no special tokens): the text prompts are sliced from."""
    return list(tokenizer.encode(CORPUS, add_special_tokens=False))
