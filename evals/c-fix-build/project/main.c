#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    double values[64];
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++)
        values[n++] = atof(argv[i]);
    printf("mean %.2f max %g\n", mean(values, n), maximum(values, n));
    return 0;
}
