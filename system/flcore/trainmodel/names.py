"""The ``-m`` names, importable without torch (the flag parser lists them): PFLlib's model names (and the
small CNNs of the heterogeneous-model presets, CNN1 and CNN3), in the order
``models.MODEL_SPECS`` builds them (models.py checks that the two agree), and the class names PFLlib's
scripts also pass."""
MODELS = ("MLR", "DNN", "FedAvgMLP", "CNN", "CNN1", "CNN3", "BNCNN", "LeNet", "Digit5CNN", "ResNet10", "ResNet18",
          "ResNet34", "AlexNet", "MobileNet", "GoogleNet", "fastText", "TextCNN", "LSTM", "BiLSTM", "Transformer",
          "AmazonMLP", "HARCNN")
ALIASES = {"Mclr_Logistic": "MLR", "MobileNetV2": "MobileNet", "FedAvgCNN": "CNN", "LSTMNet": "LSTM",
           "ResNet-18": "ResNet18", "ResNet-10": "ResNet10", "ResNet-34": "ResNet34"}
