#include "tests/doctest_main.h"
