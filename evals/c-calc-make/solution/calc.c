#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: calc A OP B\n"); return 1; }
    long a = atol(argv[1]), b = atol(argv[3]);
    const char *op = argv[2];
    if (!strcmp(op, "+")) printf("%ld\n", a + b);
    else if (!strcmp(op, "-")) printf("%ld\n", a - b);
    else if (!strcmp(op, "x")) printf("%ld\n", a * b);
    else if (!strcmp(op, "/")) { if (!b) { fprintf(stderr, "division by zero\n"); return 1; } printf("%ld\n", a / b); }
    else { fprintf(stderr, "unknown operator %s\n", op); return 1; }
    return 0;
}
