"""MinAtar Space Invaders with gymnax's rules: a cannon against a marching block of aliens on
10x10.

`rules` is the game as pure tensor functions (tested against gymnax's
`SpaceInvaders-MinAtar`); `game` hands them to the kit as a `TensorGame`, with the spaces,
time limit and pictures (`fruit_env.registration` registers the kit's env around it).
"""

from fruit_env.games.minatar_space_invaders.game import MinAtarSpaceInvaders
from fruit_env.games.minatar_space_invaders.rules import SpaceInvadersState

__all__ = ["MinAtarSpaceInvaders", "SpaceInvadersState"]
