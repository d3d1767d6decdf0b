"""The games that come with the kit, each its rules as a `TensorGame` and its env."""
