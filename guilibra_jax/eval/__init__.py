"""Evaluation: offline step metrics (:mod:`.offline`), online success in the synthetic
world (:mod:`.online`), agents and their registry (:mod:`.agents`), reports (:mod:`.report`)."""
