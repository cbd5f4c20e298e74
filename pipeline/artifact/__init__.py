"""Artifacts on the build side: where one lives and what decides a rebuild (identity), and how a command finds the artifact of a recipe and checks it was built from it (locate)."""
