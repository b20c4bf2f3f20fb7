"""A torchrun-style script that never finishes: for --timeout."""
import time

if __name__ == "__main__":
    while True:
        time.sleep(1)
