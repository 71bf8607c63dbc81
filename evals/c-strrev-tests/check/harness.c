#include <stdio.h>
#include <string.h>
#include "strrev.h"
static int check(const char *in, const char *want) {
    char buf[64]; strcpy(buf, in); str_reverse(buf);
    if (strcmp(buf, want)) { printf("%s -> %s, want %s\n", in, buf, want); return 1; }
    return 0;
}
int main(void) { return check("", "") + check("a", "a") + check("ab", "ba") + check("hello", "olleh") + check("abcd", "dcba"); }
