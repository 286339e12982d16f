"""The toy video world: a parametric text-to-video distribution with a known data manifold (see world.py)."""
