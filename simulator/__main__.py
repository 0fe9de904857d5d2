from convsim.cli import main

if __name__ == "__main__":  # a worker process loads this module too, as __mp_main__
    main()
