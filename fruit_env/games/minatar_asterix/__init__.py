"""MinAtar Asterix with gymnax's rules: dodge enemies and collect gold crossing a 10x10 board.

`rules` is the game as pure tensor functions (tested against gymnax's `Asterix-MinAtar`);
`game` hands them to the kit as a `TensorGame`, with the spaces, time limit and pictures
(`fruit_env.registration` registers the kit's env around it).
"""

from fruit_env.games.minatar_asterix.game import MinAtarAsterix
from fruit_env.games.minatar_asterix.rules import AsterixState

__all__ = ["AsterixState", "MinAtarAsterix"]
