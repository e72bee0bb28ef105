def main() -> None:
    print("skulk")
