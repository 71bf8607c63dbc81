#include <string.h>
#include "strrev.h"
int main(void) { char a[] = "abc", b[] = "", c[] = "xy"; str_reverse(a); str_reverse(b); str_reverse(c);
    return strcmp(a, "cba") || strcmp(b, "") || strcmp(c, "yx"); }
