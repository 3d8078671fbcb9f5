"""sqs-lease: long tool calls on AWS, made safe."""
