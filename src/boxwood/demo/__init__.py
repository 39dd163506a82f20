def main():
    raise SystemExit("demo: not written yet")
