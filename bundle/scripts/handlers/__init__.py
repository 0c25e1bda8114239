"""Ignite handlers of the bundle (used from the configs as ``scripts.handlers.…``)."""
# ruff: noqa: F401

from . import finite, panels, throughput, training_state
from .loss_terms import LossTerms
from .metrics import FROC, ROCAUC, PointingGame, PxAP, SoftDice
