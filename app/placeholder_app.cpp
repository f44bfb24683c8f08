namespace ft {}  // placeholder
