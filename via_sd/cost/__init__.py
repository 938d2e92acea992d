"""The cost model: what a round costs, which round pays (`gamma="auto"`), predictions and projections (model).
Pure Python, no torch; the profile it prices with is measured by core/profile.py."""
