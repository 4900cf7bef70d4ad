"""Flower's own FedAvg over fedfuse's Rust SuperNodes (`fedfuse flower-node`)."""
