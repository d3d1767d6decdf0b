"""MinAtar Breakout with gymnax's rules: a ball, a paddle and three rows of bricks on 10x10.

`rules` is the game as pure tensor functions (tested against gymnax's `Breakout-MinAtar`);
`game` hands them to the kit as a `TensorGame`, with the spaces, time limit and pictures
(`fruit_env.registration` registers the kit's env around it).
"""

from fruit_env.games.minatar_breakout.game import MinAtarBreakout
from fruit_env.games.minatar_breakout.rules import BreakoutState

__all__ = ["BreakoutState", "MinAtarBreakout"]
