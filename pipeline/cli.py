"""placeholder"""
def main():
    print("trtpipe")
