"""The games that come with the kit, each its rules as a `TensorGame` (Fruit Catcher also a
vector env class of its own, with its rules' keyword arguments; the MinAtar games are the
kit's `TensorVectorEnv` around the game, registered in `fruit_env.registration`)."""
