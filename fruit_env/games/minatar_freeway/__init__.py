"""MinAtar Freeway with gymnax's rules: a chicken crosses eight lanes of traffic on 10x10.

`rules` is the game as pure tensor functions (tested against gymnax's `Freeway-MinAtar`);
`game` hands them to the kit as a `TensorGame`, with the spaces, time limit and pictures
(`fruit_env.registration` registers the kit's env around it).
"""

from fruit_env.games.minatar_freeway.game import MinAtarFreeway
from fruit_env.games.minatar_freeway.rules import FreewayState

__all__ = ["FreewayState", "MinAtarFreeway"]
