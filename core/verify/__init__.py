"""Verification: the rules that accept, repair and add a bonus, for chains, trees and coupled lanes."""
